"""The daemon's half of the update lock (`ota.lock_file`), in the real daemon: while a station holds a
part (triggered, not yet acknowledged by the line) the update agent's swap cannot start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.config.line_io import LineIOConfig
from edge_runtime.core.samples import write_sample_video
from edge_runtime.ota.update_lock import LINE_BUSY, UpdateLock
from tests.support.waiting import wait_for


@pytest.fixture
def daemon(tmp_path: Path, demo_dir: Path) -> Iterator[Daemon]:
    cfg = Config(device_id="line-1", data_dir=tmp_path)
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.api.enabled = False
    cfg.mqtt.enabled = False
    cfg.ota.lock_file = tmp_path / "line.lock"
    video = write_sample_video(tmp_path / "parts.avi", frames=60)
    cfg.cameras = [CameraConfig(name="cam", source=str(video), fps=30, trigger=TriggerConfig(mode="on_demand"))]
    cfg.line_io = LineIOConfig.model_validate({"stations": [{
        "name": "st1", "camera": "cam", "result_deadline_ms": 60_000, "heartbeat_ms": 100,
        "nok_when": [{"field": "verdict.defect", "equals": True}]}]})
    d = Daemon(cfg)
    d.start()
    yield d
    d.stop()


def test_the_daemon_holds_the_update_lock_while_a_part_is_in_flight(daemon: Daemon, tmp_path: Path) -> None:
    assert daemon.line_io is not None
    station = daemon.line_io.stations[0]
    agent = UpdateLock(tmp_path / "line.lock", [], max_wait_s=60)
    wait_for(lambda: station.signals().ready, timeout=30, what="the station ready (model warm, camera up)")
    assert agent.blocker() is None  # an idle line: a swap may start
    agent.release()
    seq = station.trigger("PART-1")
    assert agent.blocker() == LINE_BUSY  # triggered: the swap waits
    wait_for(lambda: station.signals().result_valid, timeout=60, what="ResultValid")
    assert agent.blocker() == LINE_BUSY  # decided but not yet acknowledged by the line
    assert station.ack_result(seq)
    wait_for(lambda: agent.blocker() is None, timeout=5, what="the lock free after the ack")
    agent.release()
