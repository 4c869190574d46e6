"""A camera whose capture thread is blocked in a read when it is stopped (a real HTTP MJPEG stream that
goes silent with the connection open): it stays `stopping` and named in health until the read returns,
its own thread closes the capture, and a new camera on the same source waits for that before opening."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.capture.camera import Camera, CameraState, stopping_cameras
from edge_runtime.config import CameraConfig
from tests.app.test_lifecycle import start as start_daemon
from tests.capture.stalling import StallingMjpeg
from tests.support.mjpeg import free_port
from tests.support.waiting import wait_for

READ_TIMEOUT_S = 4.0  # FFmpeg gives up on the silent stream after this long: the blocked read returns


@pytest.fixture
def stalling() -> Iterator[StallingMjpeg]:
    server = StallingMjpeg()
    yield server
    server.close()


def camera(url: str) -> Camera:
    return Camera(CameraConfig(name="dock", source=url, open_timeout_s=5, read_timeout_s=READ_TIMEOUT_S,
                               reconnect_min_s=30))


def test_a_camera_blocked_in_a_read_stays_stopping_until_its_thread_releases_the_source(
        stalling: StallingMjpeg) -> None:
    first = camera(stalling.url)
    second: Camera | None = None
    first.start()
    try:
        assert stalling.stalled.wait(10), "the camera never connected"
        wait_for(lambda: first.stats.captured >= 1, 10, "a frame before the stream went silent")
        time.sleep(0.3)  # the read of the frame after the last one is blocked now

        t0 = time.monotonic()
        ended = first.stop(timeout=0.5)
        assert time.monotonic() - t0 < 2
        assert first._thread.is_alive()  # the read did not return
        assert first.status().state == "stopping" and ended is False
        assert stopping_cameras() == [f"camera dock: stopping: its capture thread is still blocked reading "
                                      f"{stalling.url}"]
        assert not stalling.closed  # the capture is still open: nobody released it under the thread

        # A restart on the same source (a reload) waits for the old thread instead of opening a second capture.
        second = camera(stalling.url)
        second.start()
        wait_for(lambda: "waiting for camera dock's previous capture thread" in (second.last_error or ""), 5,
                 "the new camera to say what it waits for")
        assert second.state == CameraState.CONNECTING and len(stalling.accepted) == 1

        # FFmpeg's read timeout ends the read: the old thread closes the capture, then the new one connects.
        wait_for(lambda: not first._thread.is_alive(), READ_TIMEOUT_S + 10, "the blocked read to return")
        assert first.state == CameraState.STOPPED and first.released.is_set()
        assert stopping_cameras() == []
        wait_for(lambda: len(stalling.accepted) == 2, 10, "the new camera to connect")
        assert stalling.closed and stalling.closed[0] <= stalling.accepted[1]  # released before the next open
        wait_for(lambda: second.stats.captured >= 1, 10, "a frame on the new camera")
    finally:
        stalling.close()  # the server hangs up: any read still blocked returns at once
        first.stop()
        if second is not None:
            second.stop()


def test_a_camera_stopped_while_waiting_for_the_previous_owner_never_opens_the_source(
        stalling: StallingMjpeg) -> None:
    first = camera(stalling.url)
    first.start()
    second: Camera | None = None
    try:
        assert stalling.stalled.wait(10), "the camera never connected"
        time.sleep(0.3)
        assert first.stop(timeout=0.2) is False
        second = camera(stalling.url)
        second.start()
        wait_for(lambda: "waiting for" in (second.last_error or ""), 5, "the new camera to wait")
        assert second.stop(timeout=2) is True and second.state == CameraState.STOPPED
        wait_for(lambda: not first._thread.is_alive(), READ_TIMEOUT_S + 10, "the blocked read to return")
        time.sleep(0.3)
        assert len(stalling.accepted) == 1
    finally:
        stalling.close()
        first.stop()
        if second is not None:
            second.stop()


DAEMON_CONFIG = """\
device_id: stuck-1
data_dir: {data}
model: {{path: {bundle}, threads: 2}}
api: {{host: 127.0.0.1, port: {api}}}
cameras:
  - name: cam
    source: {url}
    read_timeout_s: 20
    reconnect_min_s: 30
    trigger: {{mode: interval, interval_s: {interval}}}
"""


def test_a_daemon_reloading_a_stuck_camera_reports_it_and_shuts_down_without_waiting_for_the_read(
        stalling: StallingMjpeg, tmp_path: Path, demo_dir: Path) -> None:
    """A real `edge-runtime run`: SIGHUP changes the camera while its read is blocked (FFmpeg's read timeout
    is 20 s). /readyz names the stuck camera, the new camera waits instead of opening the stream a second
    time, and SIGTERM ends the process in the 3 s stop timeout, not the 20 s read."""
    api = free_port()
    cfg = tmp_path / "edge.yaml"
    fields = {"data": tmp_path / "data", "bundle": demo_dir, "api": api, "url": stalling.url}
    cfg.write_text(DAEMON_CONFIG.format(interval=1, **fields))
    log = tmp_path / "log"
    proc = start_daemon(cfg, log)
    try:
        assert stalling.stalled.wait(90), log.read_text()
        wait_for(lambda: camera_of(api).get("frames", {}).get("captured", 0) >= 1, 60, "a frame in the status")
        time.sleep(0.3)
        cfg.write_text(DAEMON_CONFIG.format(interval=2, **fields))
        proc.send_signal(signal.SIGHUP)
        reason = f"camera cam: stopping: its capture thread is still blocked reading {stalling.url}"
        code, health = wait_for(lambda: (r := readyz(api))[1].get("reasons") and r, 30, "the stuck camera in /readyz")
        assert code == 200 and health["state"] == "degraded" and health["reasons"] == [reason], health
        cam = camera_of(api)
        assert cam["state"] == "connecting", cam
        assert "waiting for camera cam's previous capture thread" in cam["last_error"], cam
        assert len(stalling.accepted) == 1 and not stalling.closed  # one owner of the stream
    finally:
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        rc = proc.wait(timeout=30)
        took = time.monotonic() - t0
    assert rc == 0 and took < 10, (rc, took, log.read_text()[-3000:])
    assert "daemon: stopped" in log.read_text()


def readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


def camera_of(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/status", timeout=10) as resp:
            cameras = json.loads(resp.read())["cameras"]
    except OSError:
        return {}
    return cameras[0] if cameras else {}
