"""The status page shows each station's signals (real daemon, real Chromium)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.config.line_io import LineIOConfig
from edge_runtime.core.samples import write_sample_video
from tests.support.browser import chromium
from tests.support.waiting import wait_for


@pytest.fixture
def daemon(tmp_path: Path, demo_dir: Path) -> Iterator[Daemon]:
    cfg = Config(device_id="press-8", data_dir=tmp_path / "data")
    cfg.model.path, cfg.model.threads = demo_dir, 2
    cfg.mqtt.enabled = False
    cfg.api.port, cfg.api.host = 0, "127.0.0.1"
    cfg.cameras = [CameraConfig(name="cam", source=str(write_sample_video(tmp_path / "v.avi", frames=60)), fps=10,
                                trigger=TriggerConfig(mode="on_demand"))]
    cfg.line_io = LineIOConfig.model_validate({"stations": [{
        "name": "weld-3", "camera": "cam", "result_deadline_ms": 60_000,
        "nok_when": [{"field": "verdict.confidence", "gt": -1}]}]})
    d = Daemon(cfg)
    d.start()
    yield d
    d.stop()


def test_status_page_shows_the_station_signals(daemon: Daemon) -> None:
    assert daemon.line_io is not None
    station = daemon.line_io.stations[0]
    wait_for(lambda: station.signals().ready, timeout=30, what="station ready")
    seq = station.trigger("GEAR-77")
    wait_for(lambda: station.signals().result_valid, timeout=60, what="ResultValid")
    with chromium() as browser:
        page: Any = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"http://127.0.0.1:{daemon.api.port}/")  # type: ignore[union-attr]
        page.wait_for_selector("#line-stations tr", timeout=15000)
        row = page.inner_text("#line-stations tr")
        assert "weld-3" in row and "GEAR-77" in row and "NOK" in row and str(seq) in row
        station.ack_result(seq)  # the next poll shows the FIFO empty
        page.wait_for_function("!document.querySelector('#line-stations tr').innerText.includes('NOK')",
                               timeout=10000)
        assert errors == []
