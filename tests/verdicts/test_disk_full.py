"""A full disk on a real small tmpfs: degraded, no thread dies, quiet logs, recovery without restart."""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from edge_runtime.api.guard import PROBE_MAX_AGE_S
from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.core.errors import StorageFull
from edge_runtime.core.samples import write_sample_video
from edge_runtime.verdicts.pipeline import CallbackSink
from tests.support.mjpeg import free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MB tmpfs: a real filesystem that really fills (ENOSPC), unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    """Write until the filesystem says ENOSPC; returns the filler file."""
    filler = disk / "filler"
    chunk = b"\0" * 65536
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def config(disk: Path, demo_dir: Path, video: Path, cameras: int) -> Config:
    cfg = Config(device_id="disk-test", data_dir=disk)
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.api.host, cfg.api.port = "127.0.0.1", 0  # /readyz and trigger are checked over HTTP too
    # An unreachable broker: results stay unsent, so nothing may be deleted to make room.
    cfg.mqtt.host, cfg.mqtt.port = "127.0.0.1", free_port()
    cfg.journal.min_free_mb = 0
    cfg.evidence.min_free_mb = 0  # its 64 MB default floor is larger than this whole disk
    cfg.cameras = [CameraConfig(name=f"cam{i}", source=str(video), fps=30,
                                trigger=TriggerConfig(mode="interval", interval_s=0.1)) for i in range(cameras)]
    return cfg


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sample_video(tmp_path_factory.mktemp("v") / "v.avi", frames=40)


@pytest.mark.parametrize("cameras", [1, 2])
def test_full_disk_degrades_and_heals_without_restart(cameras: int, small_disk: Path, demo_dir: Path,
                                                      video: Path, caplog: pytest.LogCaptureFixture) -> None:
    daemon = Daemon(config(small_disk, demo_dir, video, cameras))
    published: list[str] = []  # what the sinks saw: only journaled verdicts may get there
    daemon.sinks.append(CallbackSink("test", lambda result: published.append(result.id)))
    daemon.start()
    try:
        wait_for(lambda: daemon.journal.counts()["total"] >= 3, what="results before the disk fills")
        caplog.clear()
        filler = fill(small_disk)
        # The journal's fault, not only the evidence store's (they share the disk; either may come first).
        wait_for(lambda: "disk full" in daemon.health()["reasons"], timeout=30, what="degraded: disk full")
        health = daemon.health()
        # The evidence store shares the disk, so "evidence disk full" may be a second reason.
        assert "disk full" in health["reasons"] and health["ready"] is False
        status = daemon.status()
        assert status["health"]["state"] == "degraded" and status["journal"]["full"] is True
        assert "disk full" in daemon.telemetry()["health"]["reasons"]
        with pytest.raises(StorageFull):
            daemon.entry.trigger("cam0").result(timeout=10)
        base = f"http://127.0.0.1:{daemon.api.port}"  # type: ignore[union-attr]
        # /readyz is answered from a snapshot at most PROBE_MAX_AGE_S old (docs/api.md): it may lag a moment.
        ready = wait_for(lambda: (r := requests.get(f"{base}/readyz", timeout=5)).status_code == 503 and r.json(),
                         timeout=PROBE_MAX_AGE_S + 5, what="/readyz to say 503")
        assert "disk full" in ready["reasons"]
        api_status = requests.get(f"{base}/api/v1/status", timeout=5).json()
        assert api_status["ready"] is False and api_status["model_loaded"] is True  # agrees with /readyz
        refused = requests.post(f"{base}/api/v1/cameras/cam0/trigger", json={}, timeout=30)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "storage_full"
        time.sleep(4)  # the cameras keep trying for a while: threads must live, logs must stay quiet
        threads = daemon.status()["threads"]
        assert all(t["alive"] for t in threads.values()), threads
        assert {"encoder", "inspector", "mqtt-outbox", "schedule-cam0"} <= threads.keys()
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) <= 2, [r.getMessage() for r in errors]  # once a minute, not 10 a second
        assert daemon.worker.not_journaled > 0

        before = daemon.journal.counts()["total"]
        filler.unlink()
        t0 = time.monotonic()
        wait_for(lambda: daemon.health()["state"] == "ok" and daemon.journal.counts()["total"] > before,
                 timeout=20, what="recovery")
        recovery_s = time.monotonic() - t0
        print(f"disk full, {cameras} camera(s): {len(errors)} ERROR line(s) in 4+ s full, "
              f"{daemon.worker.not_journaled} verdicts refused; recovered {recovery_s:.2f} s after space returned")
        assert recovery_s < 10
        assert daemon.inspector is not None and daemon.alive()
    finally:
        daemon.stop()
    with sqlite3.connect(small_disk / "journal.sqlite3") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        journaled = {row[0] for row in conn.execute("SELECT id FROM results")}
    assert published and set(published) <= journaled  # nothing published that was not journaled


def test_watermark_deletes_the_oldest_delivered_rows_before_the_disk_fills(small_disk: Path) -> None:
    from edge_runtime.verdicts.journal import Journal
    from tests.verdicts.test_journal import make_result

    journal = Journal(small_disk / "j.sqlite3", keep_unsent=True, min_free_mb=3)
    unsent: list[str] = []
    for i in range(3000):  # ~30 MB of results through an 8 MB disk
        result = make_result(n=i)
        result.text = "x" * 10_000
        seq = journal.add(result)  # raises StorageFull if the watermark did not hold
        if i % 100 == 7:
            unsent.append(result.id)  # never acknowledged: must survive every pruning
        else:
            journal.mark_sent([seq])
    assert journal.pruned > 0 and not journal.full
    assert all(journal.get(i) is not None for i in unsent)
    assert journal.counts()["unsent"] == len(unsent)
    assert journal.integrity_check() == "ok"
    journal.close()
