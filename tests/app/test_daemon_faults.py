"""The daemon's fault paths on the real engines: model reload and its fallback, refusing queued work
at shutdown, and the hung-inspection watchdog. Work is submitted through the `Device` interface."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.app import status as status_module
from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.core import heap
from edge_runtime.core.device import DeviceCameras
from edge_runtime.core.errors import EdgeRuntimeError, InferenceError, QueueFull
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.core.samples import write_sample_video
from tests.app.test_reload import daemon_with_file
from tests.support.waiting import wait_for


@pytest.fixture
def on_demand(tmp_path: Path) -> CameraConfig:
    video = write_sample_video(tmp_path / "v.avi", frames=20)
    return CameraConfig(name="cam", source=str(video), fps=10, trigger=TriggerConfig(mode="on_demand"))


def inspect_now(cameras: DeviceCameras) -> Any:
    wait_for(lambda: cameras.latest_jpeg("cam"), what="a frame")
    return cameras.trigger("cam").result(timeout=30)


def test_a_changed_model_is_loaded_on_reload_and_the_old_one_closed(tmp_path: Path, demo_dir: Path,
                                                                     on_demand: CameraConfig) -> None:
    with daemon_with_file(tmp_path, demo_dir, [on_demand], []) as (daemon, path, cfg):
        old = daemon.inspector
        cfg.model.max_tokens = 200  # a model setting: the bundle is loaded again with it
        path.write_text(cfg.model_dump_json())
        assert daemon.reload()["applied"] == ["model.max_tokens"]
        assert daemon.inspector is not old and old is not None and not old.ready
        info = daemon.model_info()
        assert info is not None and info.ready and info.max_tokens == 200
        assert info.verdict_schema["required"] == ["defect", "category", "confidence", "notes"]
        assert inspect_now(daemon.entry).model == info.model_name


def test_a_model_swap_gives_the_old_models_freed_memory_back(tmp_path: Path, demo_dir: Path, bundle_copy: Path,
                                                             on_demand: CameraConfig,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """glibc keeps what the old model's threads freed in their arenas (1.3-5.7 MB a swap, docs/reliability.md)
    until malloc_trim: the swap trims once the old model is closed. The real trim runs, watched."""
    trim = heap._malloc_trim()
    assert trim is not None  # glibc here
    with daemon_with_file(tmp_path, demo_dir, [on_demand], []) as (daemon, path, cfg):
        old = daemon.inspector
        assert old is not None
        old_closed_at_trim: list[bool] = []

        def watched(pad: int) -> int:
            old_closed_at_trim.append(old.language.closed)
            return trim(pad)

        monkeypatch.setattr(heap, "_malloc_trim", lambda: watched)
        cfg.model.path = bundle_copy
        path.write_text(cfg.model_dump_json())
        assert daemon.reload()["applied"] == ["model.path"]
        assert daemon.config.model.path == bundle_copy
        assert old_closed_at_trim == [True]
        assert inspect_now(daemon.entry).verdict


def test_a_model_that_fails_to_load_on_reload_keeps_the_running_one(tmp_path: Path, demo_dir: Path,
                                                                     bundle_copy: Path,
                                                                     on_demand: CameraConfig) -> None:
    (bundle_copy / "language.gguf").write_bytes(b"GGUF but not a model")  # fails its checksum
    with daemon_with_file(tmp_path, demo_dir, [on_demand], []) as (daemon, path, cfg):
        old = daemon.inspector
        cfg.model.path = bundle_copy
        cfg.log_level = "debug"
        path.write_text(cfg.model_dump_json())
        outcome = daemon.reload()
        assert daemon.inspector is old and old is not None and old.ready
        assert daemon.config.model.path == demo_dir  # the running model's settings stay with it
        assert outcome["applied"] == ["log_level"]  # the rest of the file applies; the model path did not
        assert daemon.health()["state"] == "ok" and inspect_now(daemon.entry).verdict


@pytest.fixture
def bare_daemon(tmp_path: Path, demo_dir: Path) -> Iterator[Daemon]:
    cfg = Config(device_id="faults", data_dir=tmp_path / "data")
    cfg.model.path, cfg.model.threads = demo_dir, 2
    cfg.api.enabled = cfg.mqtt.enabled = False
    cfg.inspection.queue_size = 8
    daemon = Daemon(cfg)
    daemon.start()
    yield daemon
    if daemon.inspector is not None:
        daemon.stop()


def blocking_job(started: threading.Event, release: threading.Event) -> Any:
    def job(_inspector: Any) -> str:
        started.set()
        release.wait(30)
        return "ran"
    return job


def test_work_still_queued_at_shutdown_is_refused_not_left_waiting(bare_daemon: Daemon) -> None:
    started, release = threading.Event(), threading.Event()
    first = bare_daemon.entry.submit_job(blocking_job(started, release))
    assert started.wait(30)
    queued: list[Future[Any]] = [bare_daemon.entry.submit_job(lambda _i: "ran") for _ in range(8)]
    stopper = threading.Thread(target=bare_daemon.stop)
    stopper.start()
    wait_for(lambda: bare_daemon.worker._stop.is_set(), what="the stop to begin")
    release.set()  # the inspection in progress finishes; whatever has not started must be answered
    stopper.join(30)
    assert first.result(timeout=0) == "ran"
    outcomes = []
    for future in queued:
        assert future.done(), "a caller would wait forever"
        exc = future.exception(timeout=0)
        outcomes.append("ran" if exc is None else str(exc))
    refused = [o for o in outcomes if o != "ran"]
    assert refused and set(refused) == {"the daemon is shutting down"}
    assert all(isinstance(f.exception(timeout=0), QueueFull) for f in queued if f.exception(timeout=0))


def test_stop_refuses_work_not_started_even_while_an_inspection_overruns_it(bare_daemon: Daemon) -> None:
    started, release = threading.Event(), threading.Event()
    first = bare_daemon.entry.submit_job(blocking_job(started, release))
    assert started.wait(30)
    queued = [bare_daemon.entry.submit_job(lambda _i: "ran") for _ in range(8)]  # 4 handed on, 1 held, 3 queued
    try:
        bare_daemon.worker.stop(timeout=0.3)  # the inspection in progress outlasts the stop's patience
        wait_for(lambda: all(f.done() for f in queued), timeout=5, what="every waiting caller to be answered")
        assert {str(f.exception(timeout=0)) for f in queued} == {"the daemon is shutting down"}
    finally:
        release.set()
    assert first.result(timeout=30) == "ran"  # the one in progress still finishes


def test_a_hung_inspection_makes_the_pipeline_not_alive_until_it_returns(bare_daemon: Daemon) -> None:
    started, release = threading.Event(), threading.Event()
    try:
        assert bare_daemon.worker.alive(max_busy_s=0.3)
        future = bare_daemon.entry.submit_job(blocking_job(started, release))
        assert started.wait(30)
        wait_for(lambda: not bare_daemon.worker.alive(max_busy_s=0.3), what="the watchdog to see the hang")
        assert bare_daemon.worker.alive(max_busy_s=60)  # the daemon's own limit is not reached yet
    finally:
        release.set()
    assert future.result(timeout=30) == "ran"
    wait_for(lambda: bare_daemon.worker.alive(max_busy_s=0.3), what="alive again")


def test_a_hung_frame_encode_in_stage_1_makes_the_pipeline_not_ready_naming_the_encoder(
        bare_daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    # Stage 2 keeps turning (idle) while stage 1 is stuck in one frame's encode (a GPU hang in libmtmd or
    # ONNX Runtime): before, only stage 2's heartbeat counted, so /readyz stayed 200 and systemd's watchdog
    # kept being pinged while no frame was inspected.
    inspector = bare_daemon.inspector
    assert inspector is not None
    started, release = threading.Event(), threading.Event()
    encode = inspector.encode_frame

    def hung_encode(*args: Any, **kwargs: Any) -> Any:
        started.set()
        release.wait(30)
        return encode(*args, **kwargs)

    monkeypatch.setattr(inspector, "encode_frame", hung_encode)
    monkeypatch.setattr(status_module, "STALL_S", 0.3)
    try:
        assert bare_daemon.alive()
        future = bare_daemon.entry.submit_image(np.full((64, 64, 3), 128, np.uint8))
        assert started.wait(30)
        wait_for(lambda: not bare_daemon.alive(), what="the watchdog to see the hung encode")
        health = bare_daemon.health()
        assert not health["ready"] and health["state"] == "degraded"
        assert health["reasons"][0].startswith("inspection stalled: the encoder thread has been on one piece")
        assert bare_daemon.status()["threads"]["encoder"]["busy_s"] >= 0.3
        assert bare_daemon.worker.stalled(max_busy_s=60) is None  # the daemon's own limit is not reached yet
    finally:
        release.set()
    assert future.result(timeout=60).camera == "api"
    wait_for(bare_daemon.alive, what="alive again")
    assert bare_daemon.health()["ready"]


def test_a_camera_failing_every_frame_logs_one_line_a_minute_per_kind_and_counts_every_frame(
        bare_daemon: Daemon, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # E.g. a region off a frame that changed size: InferenceError("regions without a verdict") each frame.
    inspector = bare_daemon.inspector
    assert inspector is not None

    def fails(*_args: Any, **_kwargs: Any) -> Any:
        raise InferenceError("regions without a verdict: lid (outside the 320x240 frame)")

    monkeypatch.setattr(inspector, "inspect", fails)
    monkeypatch.setattr(inspector, "inspect_batch", fails)
    before = bare_daemon.worker.errors
    image = np.full((64, 64, 3), 128, np.uint8)
    with caplog.at_level(logging.ERROR, logger="edge_runtime.inference.worker"):
        for n in range(6):
            request = InspectionRequest(image, "belt", seq=n, trigger="schedule")
            bare_daemon.inspections.submit(request)
            with pytest.raises(InferenceError):
                request.future.result(timeout=30)
        other = InspectionRequest(image, "belt", seq=9, trigger="schedule", job=lambda _i: 1 / 0)
        bare_daemon.inspections.submit(other)
        with pytest.raises(ZeroDivisionError):
            other.future.result(timeout=30)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("inspection of belt failed")]
    assert len(lines) == 2, lines  # one for the six InferenceErrors, one for the other kind
    assert "regions without a verdict" in lines[0] and "division by zero" in lines[1]
    assert bare_daemon.worker.errors - before == 7


def test_an_unknown_camera_is_refused_through_the_device_interface(bare_daemon: Daemon) -> None:
    device = bare_daemon.device  # what api/ and the MQTT commands are handed: one part per role
    with pytest.raises(EdgeRuntimeError, match="no camera named 'nope'"):
        device.cameras.trigger("nope")
    assert device.status.camera_names() == [] and device.results.get_result("no-such-id") is None


def test_a_camera_whose_own_prompt_cannot_fit_the_model_counts_errors(tmp_path: Path, demo_dir: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    # The configured question is 4,000 tokens (byte-fallback emoji) in a 2,048-token context: every
    # inspection was refused as if a client had sent it (one INFO line each, counted nowhere), so the
    # camera delivered nothing while status said 0 errors.
    video = write_sample_video(tmp_path / "v.avi", frames=20)
    cams = [CameraConfig(name=name, source=str(video), fps=10, prompt="\U0001f529" * 1000,
                         trigger=TriggerConfig(mode="interval", interval_s=0.2)) for name in ("cam", "cam2")]
    cfg = Config(device_id="prompt-fit", data_dir=tmp_path / "data", cameras=cams)
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.api.enabled = False
    cfg.mqtt.enabled = False
    daemon = Daemon(cfg)
    daemon.start()
    try:
        wait_for(lambda: all(c["frames"]["errors"] >= 3 for c in daemon.status()["cameras"]),
                 what="counted errors")
        assert all(c["frames"]["inspected"] == 0 for c in daemon.status()["cameras"])
        lines = [r.getMessage() for r in caplog.records if "the context holds" in r.getMessage()]
        assert lines and all(r.levelname == "ERROR" for r in caplog.records if "the context holds" in r.getMessage())
        # one line a minute per camera, not one a frame, and the second camera is named too
        assert sorted(line.split()[2] for line in lines) == ["cam", "cam2"], lines
        with pytest.raises(EdgeRuntimeError):  # a client asking the same camera still hears it
            daemon.entry.trigger("cam").result(timeout=30)
    finally:
        daemon.stop()
