"""A running camera and its trigger loop, as the daemon holds them per configured camera, and how
they read in the status snapshot and the telemetry message."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import cv2

from edge_runtime.capture.camera import Camera
from edge_runtime.capture.scheduler import CameraSchedule
from edge_runtime.config import CameraConfig, Config, ImageLimits, load_config
from edge_runtime.config.programs import ClipConfig
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.core.governor_gate import Gate
from edge_runtime.core.inspection_queue import FrameRouter, InspectionQueue
from edge_runtime.core.result import utc_now

STOP_TIMEOUT_S = 3.0  # a shutdown's or a reload's wait for its cameras' threads, all together


class CameraRig:
    """A running camera and its trigger loop."""

    def __init__(self, cfg: CameraConfig, inspections: InspectionQueue, gate: Gate, pipelined: bool,
                 limits: ImageLimits | None = None, clip: ClipConfig | None = None,
                 offload: FrameRouter | None = None) -> None:
        self.cfg = cfg
        self.camera = Camera(cfg, limits)  # folder cameras decode with the configured image limits
        self.schedule = CameraSchedule(self.camera, cfg.trigger, cfg.prompt, inspections, gate, pipelined, offload)
        self.schedule.use_clip(clip)
        self._jpeg: tuple[int, bytes] | None = None

    def start(self) -> None:
        self.camera.start()
        self.schedule.start()

    def stop(self) -> None:
        stop_rigs([self])

    def latest_jpeg(self, quality: int) -> bytes | None:
        """The newest frame as JPEG, encoded lazily and cached per frame."""
        frame = self.camera.slot.peek()
        if frame is None:
            return None
        if self._jpeg is None or self._jpeg[0] != frame.seq:
            ok, buf = cv2.imencode(".jpg", frame.image, [cv2.IMWRITE_JPEG_QUALITY, quality])
            if not ok:
                return None
            self._jpeg = (frame.seq, buf.tobytes())
        return self._jpeg[1]


def stop_rigs(rigs: Iterable[CameraRig], timeout: float = STOP_TIMEOUT_S) -> list[str]:
    """Stop cameras together: every trigger loop and capture thread is asked to end first, then all are
    waited for against one deadline, so a shutdown or a reload takes one `timeout` however many capture
    threads are blocked in a read (one at a time, each stuck camera added its own). Returns the names of
    the cameras left `stopping` (their thread still blocked: capture/camera.py)."""
    rigs = list(rigs)
    for rig in rigs:
        rig.schedule.request_stop()
        rig.camera.request_stop()
    deadline = time.monotonic() + timeout
    for rig in rigs:
        rig.schedule.join(deadline - time.monotonic())
    return [rig.camera.name for rig in rigs if not rig.camera.wait_stopped(deadline - time.monotonic())]


def camera_status(rig: CameraRig) -> dict[str, Any]:
    """One camera's entry of the status snapshot: capture state and counters, trigger counters."""
    cam = rig.camera.status()
    s = rig.schedule.stats
    return {
        "name": cam.name, "kind": cam.kind, "source": cam.source, "state": cam.state,
        "last_error": cam.last_error, "fps": cam.fps, "trigger": rig.cfg.trigger.mode,
        "frames": {**cam.stats, "inspected": s.inspected, "skipped_unchanged": s.skipped_unchanged,
                   "skipped_busy": s.skipped_busy, "skipped_paused": s.skipped_paused,
                   "errors": s.errors, **clip_counters(rig)},
        "last_result": s.last_result,
    }


def clip_counters(rig: CameraRig) -> dict[str, int]:
    """A camera with a clip: inspections due while its ring filled, frames held, frames too large."""
    ring = rig.schedule.clip
    if ring is None:
        return {}
    return {"waiting_for_clip": rig.schedule.stats.waiting_for_clip, "clip_frames_held": len(ring),
            "clip_frames_too_large": ring.too_large, "clip_restarts": ring.restarts}


FAILING_STREAK = 5  # a camera's inspections failed in a row: health says so (one failure is no fault)


def failing_cameras(rigs: Iterable[CameraRig]) -> list[str]:
    """A health reason per camera whose last FAILING_STREAK inspections all failed: it streams and no verdict
    comes (a region outside its frames, a question it cannot ask, a model that fails). The text holds no count:
    it is a metrics label, one series while it lasts."""
    return [f"camera {rig.cfg.name}: its inspections keep failing (frames.errors in status; the log says why)"
            for rig in rigs if rig.schedule.stats.failing >= FAILING_STREAK]


def stuck_clips(rigs: Iterable[CameraRig]) -> list[str]:
    """A health reason per camera whose clip can never fill (ClipRing.stuck): it streams, and nothing is
    ever inspected."""
    out = []
    for rig in rigs:
        why = rig.schedule.clip.stuck() if rig.schedule.clip is not None else None
        if why is not None:
            out.append(f"camera {rig.cfg.name}: {why}")
    return out


def clip_of(config: Config, cam: CameraConfig) -> ClipConfig | None:
    """The clip of the camera's program (None: no program, or one without a clip)."""
    program = config.programs.get(cam.program) if cam.program is not None else None
    return program.clip if program is not None else None


def telemetry_message(status: dict[str, Any], inspections_per_min: float) -> dict[str, Any]:
    """The periodic MQTT health message, cut from a status snapshot."""
    return {
        "ts": utc_now(), "device": status["device"], "uptime_s": status["uptime_s"],
        "health": status["health"],
        "inspections_per_min": round(inspections_per_min, 2),
        "queue_depth": status["inspection"]["queue_depth"],
        "outbox_backlog": status["journal"]["unsent"],
        "outbox_parked": status["journal"]["parked"],
        "energy_j_last_inspection": status["inspection"]["energy_j_last"],
        "cameras": [{"name": c["name"], "state": c["state"], "fps": c["fps"],
                     "captured": c["frames"]["captured"], "dropped": c["frames"]["dropped"],
                     "inspected": c["frames"]["inspected"]} for c in status["cameras"]],
        "governor": status["governor"],
    }


def cameras_not_in_file(config: Config, path: Path | None) -> list[CameraConfig]:
    """Cameras the command line added beyond the file (`run --demo`): a reload keeps them."""
    if path is None:
        return list(config.cameras)
    try:
        in_file = {c.name for c in load_config(path).cameras}
    except EdgeRuntimeError:
        return []
    return [c for c in config.cameras if c.name not in in_file]
