"""The daemon in-process: real cameras (video file, HTTP MJPEG), real engines, real journal."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.core.samples import write_sample_video
from tests.support.mjpeg import MjpegCamera, free_port
from tests.support.slow_model import slow_down
from tests.support.waiting import wait_for


def daemon_config(tmp_path: Path, demo_dir: Path, cameras: list[CameraConfig]) -> Config:
    cfg = Config(device_id="line-1", data_dir=tmp_path)
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.api.port = 0
    cfg.cameras = cameras
    return cfg


@pytest.fixture
def run_daemon(tmp_path: Path, demo_dir: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(*cameras: CameraConfig, tweak: Callable[[Daemon], None] | None = None) -> Daemon:
        daemon = Daemon(daemon_config(tmp_path, demo_dir, list(cameras)))
        if tweak:
            tweak(daemon)
        daemon.start()
        started.append(daemon)
        return daemon

    yield start
    for d in started:
        if d.inspector is not None:
            d.stop()


def cam(daemon: Daemon, name: str) -> dict[str, Any]:
    return next(c for c in daemon.status()["cameras"] if c["name"] == name)


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sample_video(tmp_path_factory.mktemp("video") / "parts.avi", frames=60)


def test_video_file_camera_fills_the_journal(run_daemon: Callable[..., Daemon], video: Path) -> None:
    daemon = run_daemon(CameraConfig(name="belt", source=str(video), fps=30,
                                     trigger=TriggerConfig(mode="interval", interval_s=0.2)))
    wait_for(lambda: daemon.journal.counts()["total"] >= 3, what="3 results")
    rows = daemon.journal.query(camera="belt")
    assert {r["camera"] for r in rows} == {"belt"} and rows[0]["frame"]["width"] == 320
    status = cam(daemon, "belt")
    assert status["state"] == "streaming" and status["kind"] == "video"
    assert status["frames"]["captured"] > status["frames"]["inspected"] > 0


def test_mjpeg_stream_camera_fills_the_journal(run_daemon: Callable[..., Daemon]) -> None:
    server = MjpegCamera(fps=20).start()
    try:
        daemon = run_daemon(CameraConfig(name="mjpeg", source=server.url,
                                         trigger=TriggerConfig(mode="continuous")))
        wait_for(lambda: daemon.journal.counts()["total"] >= 3, what="3 results")
        assert cam(daemon, "mjpeg")["kind"] == "http"
        assert daemon.entry.latest_jpeg("mjpeg")[:2] == b"\xff\xd8"  # type: ignore[index]
    finally:
        server.stop()


def test_slow_model_drops_frames_instead_of_queueing(run_daemon: Callable[..., Daemon], video: Path) -> None:
    daemon = run_daemon(CameraConfig(name="fast", source=str(video), fps=50,
                                     trigger=TriggerConfig(mode="continuous")),
                        tweak=lambda d: slow_down(d, 0.4))
    depths = []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        depths.append(daemon.inspections.depth)
        time.sleep(0.05)
    # On a loaded machine the first batch may not be answered within the 3 s window: wait for one.
    wait_for(lambda: cam(daemon, "fast")["frames"]["inspected"] > 0, what="an inspected frame")
    frames = cam(daemon, "fast")["frames"]
    assert max(depths) <= 1  # one in flight per camera, never a backlog
    # 50 fps against at most 4 frames (one batch) per 0.4 s: 4 of 5 frames or more are dropped. (It was
    # 5x, which held only while the real model's own time added to the 0.4 s: a faster decode broke it.)
    assert frames["dropped"] > 2 * frames["inspected"] > 0
    assert frames["captured"] >= frames["dropped"] + frames["inspected"]


def test_a_slow_model_answers_a_continuous_camera_a_batch_at_a_time_with_bounded_frames_in_flight(
        run_daemon: Callable[..., Daemon], video: Path) -> None:
    """While the model generates, a continuous camera's newer frames are encoded into the hand-off and
    generated together as one batch: more frames answered per second than one by one, and never more
    in flight than the hand-off, one batch and the queue's one frame (docs/architecture.md)."""
    in_flight: list[Any] = []

    def counted(daemon: Daemon) -> None:
        slow_down(daemon, 0.3)
        submit = daemon.inspections.submit

        def tracked(request: Any) -> Any:
            future = submit(request)
            in_flight.append(future)
            return future

        daemon.inspections.submit = tracked  # type: ignore[method-assign]

    daemon = run_daemon(CameraConfig(name="fast", source=str(video), fps=50,
                                     trigger=TriggerConfig(mode="continuous")), tweak=counted)
    most = 0
    deadline = time.monotonic() + 60
    while cam(daemon, "fast")["frames"]["inspected"] < 12 and time.monotonic() < deadline:
        most = max(most, sum(not f.done() for f in list(in_flight)))
        time.sleep(0.01)
    assert cam(daemon, "fast")["frames"]["inspected"] >= 12
    max_batch = daemon.config.inspection.max_batch
    assert 2 < most <= 2 * max_batch + 2, most
    assert daemon.status()["inspection"]["batched_generations"] > 0


def test_stream_that_goes_away_reconnects_while_other_cameras_work(
        run_daemon: Callable[..., Daemon], video: Path) -> None:
    server = MjpegCamera(fps=20).start()
    daemon = run_daemon(
        CameraConfig(name="net", source=server.url, reconnect_min_s=0.2, reconnect_max_s=0.5,
                     read_timeout_s=2, trigger=TriggerConfig(mode="interval", interval_s=0.2)),
        CameraConfig(name="file", source=str(video), fps=30, trigger=TriggerConfig(mode="interval", interval_s=0.2)))
    wait_for(lambda: cam(daemon, "net")["frames"]["inspected"] >= 1, what="first inspection")
    server.stop()
    wait_for(lambda: cam(daemon, "net")["state"] in ("reconnecting", "failed"), what="camera to notice")
    file_before = cam(daemon, "file")["frames"]["inspected"]
    wait_for(lambda: cam(daemon, "file")["frames"]["inspected"] >= file_before + 2, what="other camera")
    net_before = cam(daemon, "net")["frames"]["inspected"]
    server.start()
    try:
        wait_for(lambda: cam(daemon, "net")["state"] == "streaming", what="reconnect")
        wait_for(lambda: cam(daemon, "net")["frames"]["inspected"] > net_before, what="inspection after reconnect")
        assert cam(daemon, "net")["frames"]["reconnects"] >= 1
    finally:
        server.stop()


def test_on_change_skips_a_still_scene_and_inspects_a_change(
        run_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    import cv2

    folder = tmp_path / "frames"
    folder.mkdir()
    still = np.full((120, 160, 3), 90, np.uint8)
    for i in range(8):
        cv2.imwrite(str(folder / f"{i:02d}.png"), still)
    changed = still.copy()
    cv2.rectangle(changed, (20, 20), (140, 100), (255, 255, 255), -1)
    cv2.imwrite(str(folder / "08.png"), changed)
    daemon = run_daemon(CameraConfig(name="still", source=str(folder), fps=5, loop=False,  # slow enough for a busy CI
                                     trigger=TriggerConfig(mode="on_change", change_check_s=0.01)))
    wait_for(lambda: cam(daemon, "still")["state"] == "ended", what="folder to end")
    wait_for(lambda: cam(daemon, "still")["frames"]["inspected"] >= 2, what="inspection of the change")
    frames = cam(daemon, "still")["frames"]
    assert frames["inspected"] == 2  # the first frame (reference) and the changed one
    assert frames["skipped_unchanged"] >= 3


def test_bad_sources_start_and_report_failed(run_daemon: Callable[..., Daemon], video: Path) -> None:
    dead_port = free_port()
    daemon = run_daemon(
        CameraConfig(name="nodev", source="/dev/video99", reconnect_min_s=0.05, reconnect_max_s=0.1),
        CameraConfig(name="nourl", source=f"http://127.0.0.1:{dead_port}/x.mjpg", open_timeout_s=1,
                     reconnect_min_s=0.05, reconnect_max_s=0.1),
        CameraConfig(name="good", source=str(video), fps=30, trigger=TriggerConfig(mode="interval", interval_s=0.1)))
    wait_for(lambda: cam(daemon, "nodev")["state"] == "failed", what="v4l2 failure")
    wait_for(lambda: cam(daemon, "nourl")["state"] == "failed", what="url failure")
    assert "could not open" in cam(daemon, "nourl")["last_error"]
    wait_for(lambda: cam(daemon, "good")["frames"]["inspected"] >= 2, what="good camera")


def test_trigger_inspects_an_on_demand_camera(run_daemon: Callable[..., Daemon], video: Path) -> None:
    daemon = run_daemon(CameraConfig(name="ondemand", source=str(video), fps=30,
                                     trigger=TriggerConfig(mode="on_demand")))
    wait_for(lambda: daemon.rigs["ondemand"].camera.slot.peek(), what="a frame")
    time.sleep(0.3)
    assert daemon.journal.counts()["total"] == 0
    result = daemon.entry.trigger("ondemand", prompt="Any burrs?").result(timeout=10)
    assert result.prompt == "Any burrs?" and daemon.journal.get(result.id) is not None


def test_cameras_ready_together_are_generated_as_one_batch(run_daemon: Callable[..., Daemon], video: Path) -> None:
    cams = [CameraConfig(name=f"cam{i}", source=str(video), fps=30, trigger=TriggerConfig(mode="continuous"))
            for i in range(4)]
    daemon = run_daemon(*cams)
    wait_for(lambda: daemon.status()["inspection"]["batched_generations"] >= 3, what="batched generations")
    wait_for(lambda: all(c["frames"]["inspected"] >= 2 for c in daemon.status()["cameras"]), what="every camera")
    for row in daemon.journal.query(limit=40):
        assert set(row["verdict"]) == {"defect", "category", "confidence", "notes"}


def test_a_pipeline_thread_that_raises_is_restarted_and_counted(run_daemon: Callable[..., Daemon],
                                                                video: Path) -> None:
    daemon = run_daemon(CameraConfig(name="belt", source=str(video), fps=30,
                                     trigger=TriggerConfig(mode="interval", interval_s=0.1)))
    schedule = daemon.rigs["belt"].schedule
    real_gate, failures = schedule.gate, [0]

    class FlakyGate:
        def decision(self) -> Any:
            if failures[0] < 2:  # an unexpected error inside the camera's trigger loop, twice
                failures[0] += 1
                raise RuntimeError("sensor read failed")
            return real_gate.decision()

    schedule.gate = FlakyGate()
    wait_for(lambda: daemon.status()["threads"]["schedule-belt"]["restarts"] == 2, what="two restarts")
    inspected = cam(daemon, "belt")["frames"]["inspected"]
    wait_for(lambda: cam(daemon, "belt")["frames"]["inspected"] > inspected, what="inspections again")
    threads = daemon.status()["threads"]
    assert threads["schedule-belt"] == {"alive": True, "restarts": 2}
    assert threads["inspector"]["alive"] and threads["encoder"]["alive"]
