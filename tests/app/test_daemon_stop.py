"""A real `edge-runtime run` with many cameras whose capture threads are blocked in a read (real HTTP MJPEG
streams that go silent with the connection open): a reload that removes several of them, and SIGTERM, take
one 3 s stop timeout in all, not 3 s per stuck camera (8 stuck cameras took ~24 s to stop, past the stop
timeout of systemd or Docker)."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.app.test_lifecycle import start as start_daemon
from tests.capture.stalling import StallingMjpeg
from tests.support.mjpeg import free_port
from tests.support.waiting import wait_for

CAMERAS = 8
# One 3 s stop timeout plus the rest of the stop on a loaded machine (3.1 s and 4.2 s here); one camera at
# a time, the four took 12 s.
BOUND_S = 8.0


@pytest.fixture
def streams() -> Iterator[list[StallingMjpeg]]:
    servers = [StallingMjpeg() for _ in range(CAMERAS)]
    yield servers
    for server in servers:
        server.close()


def config(tmp_path: Path, demo_dir: Path, api: int, urls: list[str], first: int = 0) -> str:
    cams = "".join(f"  - name: cam{i}\n    source: {url}\n    read_timeout_s: 30\n    reconnect_min_s: 30\n"
                   "    trigger: {mode: on_demand}\n" for i, url in enumerate(urls, first))
    return (f"device_id: stuck-many\ndata_dir: {tmp_path / 'data'}\nmodel: {{path: {demo_dir}, threads: 2}}\n"
            f"api: {{host: 127.0.0.1, port: {api}}}\ncameras:\n{cams}")


def cameras(port: int) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/status", timeout=10) as resp:
            return list(json.loads(resp.read())["cameras"])
    except OSError:
        return []


def test_a_reload_and_a_shutdown_stop_many_stuck_cameras_within_one_stop_timeout(
        streams: list[StallingMjpeg], tmp_path: Path, demo_dir: Path) -> None:
    api = free_port()
    urls = [s.url for s in streams]
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(config(tmp_path, demo_dir, api, urls))
    log = tmp_path / "log"
    proc = start_daemon(cfg, log)
    took_reload = took_stop = None
    try:
        for server in streams:
            assert server.stalled.wait(90), log.read_text()[-3000:]
        wait_for(lambda: len(cams := cameras(api)) == CAMERAS and all(c["frames"]["captured"] >= 1 for c in cams),
                 60, "a frame from every camera")
        time.sleep(0.5)  # every capture thread is blocked in the read after the last frame now

        # The reload removes half of them: one stop timeout for the four, not four in a row.
        cfg.write_text(config(tmp_path, demo_dir, api, urls[CAMERAS // 2:], CAMERAS // 2))
        t0 = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "daemon: config reloaded" in log.read_text(), 60, "the reload")
        took_reload = time.monotonic() - t0
        assert [c["name"] for c in cameras(api)] == [f"cam{i}" for i in range(CAMERAS // 2, CAMERAS)]
        assert not any(s.closed for s in streams)  # no read returned: the removed cameras still hold theirs
    finally:
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        rc = proc.wait(timeout=60)
        took_stop = time.monotonic() - t0
    text = log.read_text()
    assert rc == 0 and "daemon: stopped" in text, text[-3000:]
    # Every camera was stuck in its read when it was stopped (else the test would prove nothing).
    for i in range(CAMERAS):
        assert f"camera cam{i}: stopping: its capture thread is still blocked reading" in text, text[-3000:]
    assert took_reload < BOUND_S and took_stop < BOUND_S, (took_reload, took_stop, text[-3000:])
