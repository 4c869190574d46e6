"""When to inspect: trigger modes per camera and the governor gate.

Each camera has a trigger loop that takes its newest frame when an inspection is due and hands it
to the single `InspectionQueue` (inspection_queue.py; the worker draining it is in worker.py). At
most one of a camera's frames waits in that queue, and with pipelining the next is taken once the
current one is encoded, so a slow model makes cameras skip frames (counted as drops in their slot)
instead of queueing them without bound. API requests share the same queue; when it is full
they are refused (`QueueFull`), never buffered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import cv2
import numpy as np

from edge_runtime.capture.camera import Camera, Frame
from edge_runtime.capture.clip import ClipRing
from edge_runtime.config import TriggerConfig
from edge_runtime.config.programs import ClipConfig
from edge_runtime.core.batch import ClipFrame
from edge_runtime.core.errors import EdgeRuntimeError, QueueFull
from edge_runtime.core.governor_gate import Gate, GateDecision
from edge_runtime.core.inspection_queue import FrameRouter, InspectionQueue, InspectionRequest, ScheduleStats
from edge_runtime.core.supervise import SupervisedThread

log = logging.getLogger(__name__)


def thumbnail(image: np.ndarray) -> np.ndarray:
    """32x32 grey float thumbnail: cheap enough to compare every frame."""
    grey = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY) if image.ndim == 3 else image
    return cv2.resize(grey, (32, 32), interpolation=cv2.INTER_AREA).astype(np.float32) / 255.0


def scene_change(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.abs(a - b)))


class CameraSchedule:
    """The trigger loop of one camera."""

    def __init__(self, camera: Camera, trigger: TriggerConfig, prompt: str | None,
                 inspections: InspectionQueue, gate: Gate, pipelined: bool = True,
                 offload: FrameRouter | None = None) -> None:
        self.camera = camera
        self.pipelined = pipelined
        self.trigger = trigger
        self.prompt = prompt
        self.inspections = inspections
        self.gate = gate
        self.stats = ScheduleStats()
        self.offload = offload  # fleet/offload's Offloader when offload is enabled
        self._reference: np.ndarray | None = None  # thumbnail of the last inspected frame
        self._last_seq = 0
        self.clip: ClipRing | None = None  # the program's clip ring (use_clip), fed by capture
        self._stop = threading.Event()
        self._thread = SupervisedThread(f"schedule-{camera.name}", self._run, self._stop, log)

    def threads(self) -> list[SupervisedThread]:
        return [self._thread]

    def use_clip(self, clip: ClipConfig | None) -> None:
        """Hold the camera's last frames for its program's clip (None: no clip). A changed clip starts
        a new, empty ring; the same one keeps the frames it holds."""
        if clip is not None and self.clip is not None and self.clip.config == clip:
            return
        ring = ClipRing(clip) if clip is not None else None
        self.clip = ring
        self.camera.slot.listener = None if ring is None else lambda f: ring.offer(f.image, f.seq, f.captured_at)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        self.request_stop()
        self._thread.join(timeout)

    def request_stop(self) -> None:
        """Ask the loop to end, without waiting for it (`stop` or `join` does)."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        self._thread.join(max(0.0, timeout))

    def _run(self) -> None:
        mode = self.trigger.mode
        if mode == "on_demand":
            self._stop.wait()  # only EntryPoints.trigger (capture/entry.py) inspects; stay visible as alive
            return
        next_due = time.monotonic()
        while not self._stop.is_set():
            wait = self.trigger.change_check_s if mode == "on_change" else 0.0
            if mode == "interval":
                wait = max(0.0, next_due - time.monotonic())
            if wait and self._stop.wait(wait):
                return
            gate = self.gate.decision()
            route = self.offload.route(self.camera.name, gate) if self.offload is not None else None
            if route is not None:  # the central server inspects at the configured rate; the device rests
                gate = GateDecision(state=gate.state)
            if gate.paused:
                self.stats.skipped_paused += 1
                self._stop.wait(0.5)
                continue
            frame = self.camera.slot.take(self._last_seq, timeout=0.5)
            if frame is None:
                continue
            self._last_seq = frame.seq
            if mode == "interval":
                next_due = max(next_due + self.trigger.interval_s / max(gate.rate_factor, 1e-3),
                               time.monotonic())
            if mode == "on_change":
                thumb = thumbnail(frame.image)
                if self._reference is not None and \
                        scene_change(thumb, self._reference) < self.trigger.change_threshold:
                    self.stats.skipped_unchanged += 1
                    continue
                self._reference = thumb
            clip = self.clip.take() if self.clip is not None else None
            if self.clip is not None and clip is None:
                self.stats.waiting_for_clip += 1  # the ring is filling, or no new frame since the last clip
                continue
            self._inspect(frame, mode, gate, route, clip)

    def capture_for_line(self, prompt: str | None, deadline: float, on_taken: Callable[[Frame], None],
                         prepare: Callable[[InspectionRequest], None] | None = None) -> InspectionRequest:
        """A line trigger (lineio/station/): wait until `deadline` (monotonic) for the first frame
        newer than the one in the slot now, call `on_taken(frame)` the moment it is there (the part may
        move), `prepare(request)` (the caller sets its line tag and schema), and queue its inspection.
        Returns the request (its `future` is the journaled Result).
        Raises EdgeRuntimeError without a frame in time, QueueFull."""
        current = self.camera.slot.peek()
        newer_than = current.seq if current is not None else 0
        frame = self.camera.slot.take(newer_than, timeout=max(0.0, deadline - time.monotonic()))
        if frame is None:
            raise EdgeRuntimeError(f"camera {self.camera.name!r} gave no new frame in time "
                                   f"(state: {self.camera.state.value})")
        on_taken(frame)
        request = InspectionRequest(frame.image, self.camera.name, prompt or self.prompt, frame.seq,
                                    frame.capture_ms, "line")
        if prepare is not None:
            prepare(request)
        self.inspections.submit(request)
        return request

    def _inspect(self, frame: Frame, trigger: str, gate: GateDecision, route: str | None = None,
                 clip: tuple[ClipFrame, ...] | None = None) -> None:
        request = InspectionRequest(frame.image, self.camera.name, self.prompt, frame.seq,
                                    frame.capture_ms, trigger)
        if clip is not None:  # the question is about the clip; its newest frame stands for it
            request.image, request.seq, request.clip = clip[-1].image, clip[-1].seq, clip
        started = time.monotonic()
        try:
            future = self._submit(request, route)
        except QueueFull:
            self.stats.skipped_busy += 1
            self._stop.wait(0.05)
            return
        # One frame per camera in each stage: with pipelining the next frame may be encoded while this
        # one is generated; frames arriving meanwhile replace each other in the slot (counted drops).
        pipelined = self.pipelined and trigger == "continuous" and gate.rate_factor >= 1.0
        while not self._stop.is_set():
            if pipelined and request.encoded.wait(0.5):
                break
            try:
                future.result(timeout=0 if pipelined else 0.5)
                break
            except FutureTimeout:
                continue
            except Exception:  # noqa: BLE001 - the worker already counted and logged it
                break
        if trigger == "continuous" and gate.rate_factor < 1.0:
            # Throttled continuous mode keeps the model busy only `rate_factor` of the time.
            busy = time.monotonic() - started
            self._stop.wait(busy * (1.0 / max(gate.rate_factor, 1e-3) - 1.0))

    def _submit(self, request: InspectionRequest, route: str | None) -> Future[Any]:
        """The local queue, or the central server when offload engages (docs/scale-out.md). A local
        frame's image is held by offload for a second opinion on its verdict (its escalation sink)."""
        offload = self.offload
        if offload is not None and route is not None:
            return offload.take(request, route)
        if offload is not None:
            offload.hold(request)
        try:
            return self.inspections.submit(request)
        except QueueFull:
            if offload is None:
                raise
            offload.release(request)  # not inspected here: no local verdict to escalate
            if not offload.engages_on_queue_full:
                raise
            return offload.take(request, "queue_full")
