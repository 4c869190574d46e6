"""When to inspect: trigger modes per camera, the governor gate, and the one bounded queue.

Each camera has a trigger loop that takes its newest frame when an inspection is due and hands it to
the single `InspectionQueue`. At most one inspection per camera is in flight, so a slow model makes
cameras skip frames (counted as drops in their slot) instead of queueing them. API requests share
the same queue; when it is full they are refused (`QueueFull`), never buffered.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from .capture import Camera, Frame
from .config import TriggerConfig
from .contracts import BatchJob, GateDecision, ResultListener
# Gate, OpenGate and QueueFull lived here; re-exported so that old import paths keep working.
from .contracts import Gate as Gate
from .contracts import OpenGate as OpenGate
from .contracts import QueueFull as QueueFull
from .errors import StorageFull
from .result import Result
from .supervise import RateLimitedLog, SupervisedThread

log = logging.getLogger(__name__)


@dataclass
class InspectionRequest:
    image: np.ndarray | None
    camera: str
    prompt: str | None = None
    seq: int = 0
    capture_ms: float = 0.0
    trigger: str = "api"
    journal: bool = True
    job: Callable[[Any], Any] | None = None  # runs instead of an inspection (chat completions)
    future: Future[Any] = field(default_factory=Future)
    encoded: threading.Event = field(default_factory=threading.Event)  # set once the encoder stage is done
    enqueued: float = field(default_factory=time.perf_counter)


class InspectionQueue:
    """The one bounded queue in front of the model."""

    def __init__(self, maxsize: int) -> None:
        self._q: queue.Queue[InspectionRequest | None] = queue.Queue(maxsize)
        self.maxsize = maxsize

    def submit(self, request: InspectionRequest) -> Future[Any]:
        try:
            self._q.put_nowait(request)
        except queue.Full:
            raise QueueFull(f"the inspection queue is full ({self.maxsize} waiting)") from None
        return request.future

    def get(self, timeout: float) -> InspectionRequest | None:
        try:
            return self._q.get(timeout=timeout)
        except queue.Empty:
            return None

    def wake(self) -> None:
        try:
            self._q.put_nowait(None)
        except queue.Full:
            pass

    @property
    def depth(self) -> int:
        return self._q.qsize()


@dataclass
class ScheduleStats:
    inspected: int = 0
    skipped_unchanged: int = 0
    skipped_busy: int = 0
    skipped_paused: int = 0
    errors: int = 0
    last_result: dict[str, Any] | None = None


def thumbnail(image: np.ndarray) -> np.ndarray:
    """32x32 grey float thumbnail: cheap enough to compare every frame."""
    grey = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY) if image.ndim == 3 else image
    return cv2.resize(grey, (32, 32), interpolation=cv2.INTER_AREA).astype(np.float32) / 255.0


def scene_change(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.abs(a - b)))


class CameraSchedule:
    """The trigger loop of one camera."""

    def __init__(self, camera: Camera, trigger: TriggerConfig, prompt: str | None,
                 inspections: InspectionQueue, gate: Gate, pipelined: bool = True) -> None:
        self.camera = camera
        self.pipelined = pipelined
        self.trigger = trigger
        self.prompt = prompt
        self.inspections = inspections
        self.gate = gate
        self.stats = ScheduleStats()
        self.offload: Any = None  # the Offloader (offload/router.py) when offload is enabled
        self._reference: np.ndarray | None = None  # thumbnail of the last inspected frame
        self._last_seq = 0
        self._stop = threading.Event()
        self._thread = SupervisedThread(f"schedule-{camera.name}", self._run, self._stop, log)

    def threads(self) -> list[SupervisedThread]:
        return [self._thread]

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        mode = self.trigger.mode
        if mode == "on_demand":
            self._stop.wait()  # inspections come only through Daemon.trigger(); stay visible as alive
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
            self._inspect(frame, mode, gate, route)

    def _inspect(self, frame: Frame, trigger: str, gate: GateDecision, route: str | None = None) -> None:
        request = InspectionRequest(frame.image, self.camera.name, self.prompt, frame.seq,
                                    frame.capture_ms, trigger)
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
        """The local queue, or the central server when offload engages (docs/scale-out.md)."""
        offload = self.offload
        if offload is not None and route is not None:
            return offload.take(request, route)
        try:
            future = self.inspections.submit(request)
        except QueueFull:
            if offload is None or not offload.engages_on_queue_full:
                raise
            return offload.take(request, "queue_full")
        if offload is not None:
            future.add_done_callback(lambda f: offload.after_local(request, f))
        return future


class InspectionWorker:
    """Takes requests off the queue, runs the inspector, journals, then tells the listeners."""

    def __init__(self, inspections: InspectionQueue, get_inspector: Callable[[], Any],
                 journal: Any, gate: Gate, stats_for: Callable[[str], ScheduleStats | None],
                 overlap: bool = True, max_batch: int = 4) -> None:
        self.inspections = inspections
        self.get_inspector = get_inspector
        self.journal = journal
        self.gate = gate
        self.stats_for = stats_for
        self.listeners: list[ResultListener] = []
        # Around the journal row of journaled results: evidence and rules (before), their actions (after).
        self.before_journal: list[Callable[[np.ndarray | None, Result], None]] = []
        self.after_journal: list[ResultListener] = []
        self.heartbeat = time.monotonic()
        self.busy_since: float | None = None
        self.inspected = 0
        self.errors = 0
        self.not_journaled = 0  # verdicts refused or lost to a full disk (none of them was published)
        self._full_log = RateLimitedLog(log)
        self.batches = 0  # generations that ran several cameras' frames as parallel sequences
        self.energy: Callable[[float, float], float | None] | None = None  # joules between two instants
        self.last_energy_j: float | None = None
        self.overlap = overlap
        self.max_batch = max_batch if overlap else 1  # batching needs frames encoded ahead of generation
        self._stop = threading.Event()
        # Stage 1 (encoder) hands each request to stage 2 (language model) through a one-slot queue,
        # so frame N+1 is decoded, preprocessed and encoded while frame N is generated.
        self._handoff: queue.Queue[tuple[InspectionRequest, Any]] = queue.Queue(maxsize=self.max_batch)
        self._encoder = SupervisedThread("encoder", self._encode_loop, self._stop, log)
        self._thread = SupervisedThread("inspector", self._run, self._stop, log)

    def threads(self) -> list[SupervisedThread]:
        return [self._encoder, self._thread]

    def start(self) -> None:
        self._encoder.start()
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the inspection in progress (its result is journaled), then stop."""
        self._stop.set()
        self.inspections.wake()
        for thread in (self._encoder, self._thread):
            thread.join(timeout)

    def alive(self, max_busy_s: float) -> bool:
        """True while both stages turn and no single inspection has hung."""
        if not (self._thread.is_alive() and self._encoder.is_alive()):
            return False
        if self.busy_since is not None:
            return time.monotonic() - self.busy_since < max_busy_s
        return time.monotonic() - self.heartbeat < 5.0

    def _encode_loop(self) -> None:
        while not self._stop.is_set():
            request = self.inspections.get(timeout=1.0)
            if request is None or not request.future.set_running_or_notify_cancel():
                continue
            if request.journal and self.journal.refusing():
                # The disk is full: refuse before the model spends anything on a verdict nobody gets.
                self._storage_full(request, StorageFull("disk full: the journal cannot store results"))
                continue
            encoded: Any = None
            if self.overlap and request.job is None and request.image is not None:
                try:
                    inspector = self.get_inspector()
                    encoded = (inspector, inspector.encode(request.image))
                except Exception as exc:  # noqa: BLE001 - handed on and reported by stage 2
                    encoded = exc
            request.encoded.set()
            while not self._stop.is_set():
                try:
                    self._handoff.put((request, encoded), timeout=0.5)
                    break
                except queue.Full:
                    continue
            else:
                request.future.set_exception(QueueFull("the daemon is shutting down"))

    def _run(self) -> None:
        while not self._stop.is_set() or not self._handoff.empty():
            self.heartbeat = time.monotonic()
            try:
                ready = [self._handoff.get(timeout=1.0)]
            except queue.Empty:
                continue
            while len(ready) < self.max_batch:  # other cameras' frames that are ready now join the batch
                try:
                    ready.append(self._handoff.get_nowait())
                except queue.Empty:
                    break
            self.busy_since = time.monotonic()
            try:
                work = [(request, self._usable(encoded)) for request, encoded in ready]
                batchable = [(r, e) for r, e in work
                             if r.job is None and e is not None and not isinstance(e, Exception)]
                batched = {id(r) for r, _ in batchable} if len(batchable) > 1 else set()
                if batched:
                    self._inspect_batch(batchable)
                for request, encoded in work:
                    if id(request) not in batched:
                        self._finish(request, encoded)
            finally:
                self.busy_since = None
        # Refuse whatever is still queued so no caller waits forever.
        while (leftover := self.inspections.get(timeout=0)) is not None:
            leftover.future.set_exception(QueueFull("the daemon is shutting down"))

    def _usable(self, encoded: Any) -> Any:
        """The embeddings, unless a reload replaced the model that computed them (then: encode again)."""
        if encoded is None or isinstance(encoded, Exception):
            return encoded
        return encoded[1] if encoded[0] is self.get_inspector() else None

    def _finish(self, request: InspectionRequest, encoded: Any) -> None:
        try:
            if isinstance(encoded, Exception):
                raise encoded
            result = self._inspect(request, encoded)
        except Exception as exc:  # noqa: BLE001 - reported to the caller; the loop goes on
            self._failed(request, exc)
        else:
            request.future.set_result(result)

    def _failed(self, request: InspectionRequest, exc: Exception) -> None:
        if isinstance(exc, StorageFull):
            self._storage_full(request, exc)
            return
        self.errors += 1
        stats = self.stats_for(request.camera)
        if stats:
            stats.errors += 1
        log.error("inspection of %s failed: %s", request.camera, exc)
        request.future.set_exception(exc)

    def _storage_full(self, request: InspectionRequest, exc: StorageFull) -> None:
        """Counted, and logged once a minute (a camera at 10 fps made 10 error lines a second)."""
        self.not_journaled += 1
        self._full_log.log(logging.ERROR, "inspection: %s; verdicts are neither journaled nor published "
                           "until space returns", exc)
        request.future.set_exception(exc)

    def _inspect_batch(self, work: list[tuple[InspectionRequest, Any]]) -> None:

        gate = self.gate.decision()
        t0 = time.monotonic()
        jobs = [BatchJob(enc, r.camera, r.prompt, r.seq, r.capture_ms, gate.state) for r, enc in work]
        try:
            outcomes = self.get_inspector().inspect_batch(jobs)
            self.batches += 1
        except Exception as exc:  # noqa: BLE001 - the whole batch failed: every caller hears it
            for request, _ in work:
                self._failed(request, exc)
            return
        energy = self.energy(t0, time.monotonic()) if self.energy is not None else None
        for (request, _), outcome in zip(work, outcomes, strict=True):
            if isinstance(outcome, Exception):
                self._failed(request, outcome)
                continue
            if energy is not None:
                outcome.energy_j = self.last_energy_j = round(energy / len(work), 4)
            try:
                delivered = self._deliver(request, outcome)
            except Exception as exc:  # noqa: BLE001 - e.g. a full disk: that caller hears it, the rest go on
                self._failed(request, exc)
            else:
                request.future.set_result(delivered)

    def _inspect(self, request: InspectionRequest, encoded: Any = None) -> Any:
        inspector = self.get_inspector()
        if request.job is not None:
            return request.job(inspector)
        gate = self.gate.decision()
        t0 = time.monotonic()
        result: Result = inspector.inspect(request.image, camera=request.camera, prompt=request.prompt,
                                           seq=request.seq, capture_ms=request.capture_ms,
                                           governor=gate.state, encoded=encoded)
        if self.energy is not None:
            result.energy_j = self.last_energy_j = self.energy(t0, time.monotonic())
        return self._deliver(request, result)

    def _deliver(self, request: InspectionRequest, result: Result) -> Result:
        """Journal first (durable before anyone else sees it), then counters, log and listeners."""
        if request.journal:
            for hook in self.before_journal:
                hook(request.image, result)  # the image the model saw (ROI crop); hooks never raise
            self.journal.add(result)  # raises StorageFull: then nobody sees this verdict
            self._full_log.reset()
            for after in self.after_journal:
                after(result)
        self.inspected += 1
        stats = self.stats_for(request.camera)
        if stats:
            stats.inspected += 1
            stats.last_result = result.to_dict()
        log.info("result %s camera=%s verdict=%s total=%.0fms", result.id, result.camera,
                 json.dumps(result.verdict, ensure_ascii=False), result.timings_ms["total"])
        for listener in self.listeners:
            try:
                listener(result)
            except Exception:
                log.exception("result listener failed")
        return result
