"""The Offloader: decides which frames go to the central server, sends them from its own workers,
journals the answers like local results, and falls back (local inspection or a counted drop).

It never blocks a caller: `take()` only puts a job on a bounded queue (a full queue takes the
fallback at once). Every frame taken is accounted for exactly once: remote, fallback_local,
dropped (by reason) or failed; `in_flight` covers the rest, so the sum always adds up. A remote
answer the journal refuses is not a lost frame: it is counted in `store_failures` and the frame
takes the fallback (so `failed` stays 0; the key is kept for dashboards and the sum).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from jsonschema import Draft202012Validator

from edge_runtime.config.offload import OffloadConfig
from edge_runtime.core.errors import EdgeRuntimeError, QueueFull
from edge_runtime.core.governor_gate import GateDecision
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.fleet.offload.client import Answer, Endpoint, chat_request, encode_jpeg
from edge_runtime.fleet.offload.escalation import Escalation

log = logging.getLogger(__name__)

STORE_FAULT = "offload results cannot be stored"
STORE_FAULT_QUIET_S = 300.0  # degraded until a remote result is stored, or this long without a failure
ENDPOINTS_FAULT = "offload endpoints down"


class Dropped(EdgeRuntimeError):
    """Every endpoint failed and the fallback is `drop` (or local inspection could not take the frame)."""


@dataclass
class _Job:
    request: InspectionRequest
    reason: str  # remote | queue_full | governor | escalate
    future: Future[Result]
    second_opinion_of: str | None = None


class _Manifest(Protocol):
    @property
    def verdict_schema(self) -> dict[str, Any]: ...


class _Bundle(Protocol):
    @property
    def manifest(self) -> _Manifest: ...


class LoadedModel(Protocol):
    """What offload reads of the loaded model (`inference/inspector.py:Inspector`): the verdict's
    schema, which every remote answer must follow, and the prompt of a request that names none."""

    @property
    def bundle(self) -> _Bundle: ...

    @property
    def default_prompt(self) -> str: ...


class Offloader:
    """A daemon service (start/stop). `deliver` journals and publishes a Result (the worker's own path),
    `local` submits a request to the local inspection queue, `inspector` gives the loaded model's schema."""

    def __init__(self, cfg: OffloadConfig, remote_cameras: set[str], device_id: str,
                 inspector: Callable[[], LoadedModel], deliver: Callable[[InspectionRequest, Result], Result],
                 local: Callable[[InspectionRequest], Future[Result]], gate: Callable[[], GateDecision],
                 on_fault: Callable[[str, bool], None] | None = None) -> None:
        self.cfg = cfg
        self.remote_cameras = remote_cameras
        self.device_id = device_id
        self.inspector = inspector
        self.deliver = deliver
        self.local = local
        self.gate = gate
        self.on_fault = on_fault
        self.endpoints = [Endpoint(e, cfg) for e in cfg.endpoints]
        self._queue: queue.Queue[_Job] = queue.Queue(cfg.queue_size)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._validator: tuple[int, Draft202012Validator] | None = None
        self.taken: Counter[str] = Counter()  # by reason
        self.outcomes: Counter[str] = Counter()  # remote, fallback_local, dropped, failed
        self.dropped: Counter[str] = Counter()  # by why
        self.escalations = Counter[str]()  # asked, refused (queue full)
        self.worker_errors = 0
        self._fault = False  # every endpoint down and fallback drop: frames are being lost
        self._deliver_lock = threading.Lock()
        self.store_failures = 0  # remote verdicts the journal refused; each frame took the fallback
        self.last_store_error: str | None = None
        self._store_fault = False
        self._store_logged = -1e9
        self._store_failed_at = 0.0
        self._error_logged = -1e9
        # Second opinions: a sink of committed local verdicts, holding their images until then.
        self.escalation = Escalation.from_config(cfg, self.second_opinion) if cfg.escalate is not None else None

    # ---- routing ------------------------------------------------------------------------------

    def route(self, camera: str, gate: GateDecision) -> str | None:
        """Why this camera's next frame goes to the central server, or None (inspect here)."""
        if camera in self.remote_cameras:
            return "remote"
        if self.cfg.engage.governor and (gate.paused or gate.rate_factor < 1.0):
            return "governor"
        return None

    def set_remote(self, camera: str, remote: bool) -> None:
        """Mark a camera as always remote (or not): cameras start, and restart on reload, through here."""
        with self._lock:
            self.remote_cameras = (self.remote_cameras | {camera}) if remote else (self.remote_cameras - {camera})

    @property
    def engages_on_queue_full(self) -> bool:
        return self.cfg.engage.queue_full

    def take(self, request: InspectionRequest, reason: str) -> Future[Result]:
        """Accept a frame for the central server; never blocks. The future ends with the Result
        (remote or local fallback) or with `Dropped`."""
        job = _Job(request, reason, Future())
        job.future.set_running_or_notify_cancel()
        with self._lock:
            self.taken[reason] += 1
        if self._stop.is_set():
            self._fallback(job, "shutting down")
            return job.future
        self._ensure_workers()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self._fallback(job, "offload queue full")
        return job.future

    def hold(self, request: InspectionRequest) -> None:
        """A camera's frame goes to the local queue: keep its image for a second opinion (escalation)."""
        if self.escalation is not None:
            self.escalation.hold(request)

    def release(self, request: InspectionRequest) -> None:
        """The local queue refused the frame held by `hold`."""
        if self.escalation is not None:
            self.escalation.release(request)

    def second_opinion(self, result: Result, image: np.ndarray, prompt: str | None = None) -> Future[Result]:
        """Ask the central server about the frame behind `result`; the answer is journaled as a remote
        Result with `source.second_opinion_of = result.id`. Never blocks; a full queue refuses (Dropped).
        The API a rules engine calls (issue 17)."""
        request = InspectionRequest(image, result.camera, prompt or result.prompt, result.frame.seq,
                                    trigger="escalate")
        job = _Job(request, "escalate", Future(), second_opinion_of=result.id)
        job.future.set_running_or_notify_cancel()
        if self._stop.is_set():
            self._resolve_undelivered(job, "shutting down")
            return job.future
        self._ensure_workers()
        try:
            self._queue.put_nowait(job)
            with self._lock:
                self.escalations["asked"] += 1
        except queue.Full:
            with self._lock:
                self.escalations["refused"] += 1
            job.future.set_exception(Dropped("the offload queue is full; no second opinion"))
        return job.future

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._ensure_workers()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the requests in progress; frames still queued take the fallback."""
        self._stop.set()
        if self.escalation is not None:
            self.escalation.stop()
        for thread in self._threads:
            thread.join(timeout)
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            self._resolve_undelivered(job, "shutting down")

    def _ensure_workers(self) -> None:
        """Start the workers, and restart any that died (they should not: see _work)."""
        with self._lock:
            if self._stop.is_set():
                return
            alive = [t for t in self._threads if t.is_alive()]
            if len(alive) < len(self._threads):
                self.worker_errors += len(self._threads) - len(alive)
            while len(alive) < self.cfg.workers:
                thread = threading.Thread(target=self._work, name=f"offload-{len(alive)}", daemon=True)
                thread.start()
                alive.append(thread)
            self._threads = alive

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                job = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self._handle(job)
            except Exception:  # a worker must outlive any one frame
                with self._lock:
                    self.worker_errors += 1
                    count = self.worker_errors
                    now = time.monotonic()
                    say = now - self._error_logged >= 60
                    if say:
                        self._error_logged = now
                if say:  # the first, then once a minute: a fault on every frame must not flood the log
                    log.exception("offload: worker error (%d so far); the frame takes the fallback", count)
                if not job.future.done():
                    self._resolve_undelivered(job, "internal error")

    # ---- one frame -----------------------------------------------------------------------------

    def _handle(self, job: _Job) -> None:
        request = job.request
        assert request.image is not None
        t0 = time.perf_counter()
        inspector = self.inspector()
        schema = inspector.bundle.manifest.verdict_schema
        prompt = request.prompt or inspector.default_prompt
        jpeg = encode_jpeg(request.image, self.cfg.max_image_side, self.cfg.jpeg_quality)
        jpeg_ms = (time.perf_counter() - t0) * 1000
        validator = self._validator_for(schema)
        answer: Answer | None = None
        for endpoint in self.endpoints:
            body = json.dumps(chat_request(jpeg, prompt, schema, endpoint.cfg.model, self.cfg.max_tokens)).encode()
            answer = endpoint.ask(body, validator, self._stop)
            if answer is not None or self._stop.is_set():
                break
        self._update_fault()
        if answer is None:
            self._resolve_undelivered(job, "all endpoints down" if not self._stop.is_set() else "shutting down")
            return
        result = self._result(job, prompt, answer, jpeg_ms, (time.perf_counter() - t0) * 1000)
        try:
            with self._deliver_lock:  # the worker's delivery path expects one result at a time
                delivered = self.deliver(request, result)
        except Exception as exc:  # noqa: BLE001 - any store failure: the frame is inspected here instead
            self._store_failed(job, answer, exc)
            return
        self._store_healed()
        with self._lock:
            self.outcomes["remote" if job.reason != "escalate" else "second_opinion"] += 1
        job.future.set_result(delivered)

    def _store_failed(self, job: _Job, answer: Answer, exc: Exception) -> None:
        """A remote verdict that could not be journaled (issue 27): never a silent loss. Counted,
        logged (the first, then once a minute), degraded until a remote result is stored again, and
        the frame takes the fallback (local inspection) like a frame no endpoint answered."""
        error = f"{type(exc).__name__}: {exc}"[:300].encode("utf-8", "backslashreplace").decode("utf-8")
        now = time.monotonic()
        with self._lock:
            self.store_failures += 1
            self.last_store_error = error
            count = self.store_failures
            say = now - self._store_logged >= 60
            if say:
                self._store_logged = now
            became = not self._store_fault
            self._store_fault = True
            self._store_failed_at = now
        if say:
            log.error("offload: a result from %s could not be stored (%s); the frame takes the fallback "
                      "(%s); %d so far", answer.endpoint, error, self.cfg.fallback, count)
        if became and self.on_fault is not None:
            self.on_fault(STORE_FAULT, True)
        self._resolve_undelivered(job, "remote result not stored")

    def _store_healed(self, quiet_s: float | None = None) -> None:
        """A remote result was stored (or, with `quiet_s`: none failed for that long, e.g. no remote
        traffic any more after a reload): no longer degraded."""
        with self._lock:
            if quiet_s is not None and time.monotonic() - self._store_failed_at < quiet_s:
                return
            healed, self._store_fault = self._store_fault, False
        if healed:
            log.info("offload: remote results are stored again")
            if self.on_fault is not None:
                self.on_fault(STORE_FAULT, False)

    def _result(self, job: _Job, prompt: str, answer: Answer, jpeg_ms: float, total_ms: float) -> Result:
        request = job.request
        assert request.image is not None
        h, w = request.image.shape[:2]
        source: dict[str, Any] = {"engine": "remote", "endpoint": answer.endpoint, "model": answer.model,
                                  "reason": job.reason}
        if job.second_opinion_of is not None:
            source["second_opinion_of"] = job.second_opinion_of
        timings = {"capture": round(request.capture_ms, 3), "preprocess": round(jpeg_ms, 3),
                   "remote": round(answer.latency_ms, 3), "total": round(request.capture_ms + total_ms, 3)}
        return Result(device=self.device_id, camera=request.camera, frame=FrameInfo(request.seq, w, h),
                      verdict=answer.verdict, text=answer.text, model=answer.model, timings_ms=timings,
                      prompt=prompt, governor=self.gate().state, source=source)

    def _resolve_undelivered(self, job: _Job, why: str) -> None:
        if job.reason == "escalate":  # the local verdict stands; only count the missing second opinion
            with self._lock:
                self.escalations["failed"] += 1
            job.future.set_exception(Dropped(f"no second opinion: {why}"))
            return
        self._fallback(job, why)

    def _fallback(self, job: _Job, why: str) -> None:
        """Local inspection (unless paused by the governor, or configured to drop), else a counted drop."""
        if self.cfg.fallback == "local" and why != "shutting down" and not self.gate().paused:
            local = dataclasses.replace(job.request, future=Future(), encoded=threading.Event(),
                                        enqueued=time.perf_counter())
            try:
                inner = self.local(local)
            except QueueFull:
                why = "local queue full"
            except Exception as exc:  # noqa: BLE001 - a refused fallback is a counted drop, never a dead worker
                why = f"local inspection refused ({type(exc).__name__})"
            else:
                with self._lock:
                    self.outcomes["fallback_local"] += 1
                inner.add_done_callback(lambda f: _copy(f, job.future))
                return
        elif self.cfg.fallback == "local" and why != "shutting down":
            why = "governor paused"
        with self._lock:
            self.outcomes["dropped"] += 1
            self.dropped[why] += 1
        job.future.set_exception(Dropped(f"frame dropped: {why}"))

    def _validator_for(self, schema: dict[str, Any]) -> Draft202012Validator:
        cached = self._validator
        if cached is None or cached[0] != id(schema):
            cached = self._validator = (id(schema), Draft202012Validator(schema))
        return cached[1]

    def _update_fault(self) -> None:
        """Degraded only while frames are being lost: every circuit open and fallback `drop`."""
        down = all(e.breaker.state != "closed" for e in self.endpoints)
        fault = down and self.cfg.fallback == "drop"
        if fault != self._fault:
            self._fault = fault
            log.warning("offload: %s", "every endpoint is down; frames are dropped" if fault
                        else "an endpoint answers again")
            if self.on_fault is not None:
                self.on_fault(ENDPOINTS_FAULT, fault)

    # ---- status --------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        if self._store_fault:
            self._store_healed(quiet_s=STORE_FAULT_QUIET_S)
        with self._lock:
            taken = sum(self.taken.values())
            done = sum(v for k, v in self.outcomes.items() if k != "second_opinion")
            frames = {"taken": taken, "remote": self.outcomes["remote"],
                      "fallback_local": self.outcomes["fallback_local"], "dropped": self.outcomes["dropped"],
                      "failed": self.outcomes["failed"], "in_flight": taken - done}
            reasons = [r for r, on in ((ENDPOINTS_FAULT, self._fault), (STORE_FAULT, self._store_fault)) if on]
            return {
                "enabled": True, "state": "degraded" if reasons else "ok", "reasons": reasons,
                "fallback": self.cfg.fallback, "remote_cameras": sorted(self.remote_cameras),
                "engage": {"queue_full": self.cfg.engage.queue_full, "governor": self.cfg.engage.governor,
                           "escalate": self.cfg.escalate.when if self.cfg.escalate else None},
                "queue_depth": self._queue.qsize(), "queue_size": self.cfg.queue_size,
                "frames": frames, "taken_by_reason": dict(self.taken), "dropped_by_reason": dict(self.dropped),
                "second_opinions": {"asked": self.escalations["asked"], "refused": self.escalations["refused"],
                                    "answered": self.outcomes["second_opinion"],
                                    "failed": self.escalations["failed"],
                                    **(self.escalation.status() if self.escalation is not None else {})},
                "worker_errors": self.worker_errors,
                "store_failures": self.store_failures, "last_store_error": self.last_store_error,
                "endpoints": [e.status() for e in self.endpoints],
            }


def _copy(source: Future[Result], target: Future[Result]) -> None:
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())
