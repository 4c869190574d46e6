"""The one bounded queue in front of the model, what goes through it, and per-camera counters.

API requests and camera schedules share the queue; when it is full they are refused (`QueueFull`),
never buffered. Here apart from `scheduler.py` so that the worker (`worker.py`) needs no trigger loop.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from edge_runtime.core.batch import ClipFrame
from edge_runtime.core.device import ChatJob
from edge_runtime.core.errors import QueueFull
from edge_runtime.core.governor_gate import GateDecision
from edge_runtime.core.result import Result


@dataclass(frozen=True)
class LineTag:
    """The line job a request answers (a station's trigger): its result is journaled with these."""

    station: str
    part_id: str
    recipe: str
    seq: int


@dataclass
class InspectionRequest:
    image: np.ndarray | None
    camera: str
    prompt: str | None = None
    seq: int = 0
    capture_ms: float = 0.0
    trigger: str = "api"
    journal: bool = True
    job: Callable[[Any], Any] | None = None  # runs instead of an inspection (`Device.submit_job`)
    # The verdict's own JSON schema (a line station's recipe): the verdict is constrained by it and
    # validated against it instead of the bundle's verdict_schema; None: the bundle's.
    schema: dict[str, Any] | None = None
    line: LineTag | None = None  # a line station's job: travels to the result (verdicts/pipeline.py)
    # The key offload's escalation holds this frame's image under (fleet/offload/escalation.py); travels
    # to the result like `line`, so the escalation sink finds the image of a committed verdict.
    offload_tag: int | None = None
    chat: ChatJob | None = None  # a chat completion: generated in the worker's batch beside the verdicts
    program: str | None = None  # the inspection program by name (a line recipe's); None: the camera's
    clip: tuple[ClipFrame, ...] | None = None  # a program's clip, oldest first (`image` is its newest frame)
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
    waiting_for_clip: int = 0  # inspections due while the program's clip ring was not full or not new
    errors: int = 0
    failing: int = 0  # the camera's inspections that failed in a row (the next delivered verdict resets it)
    last_result: dict[str, Any] | None = None


# Journal a Result and tell the sinks (verdicts/pipeline.py); raises StorageFull when the journal refuses.
Deliver = Callable[[InspectionRequest, Result], Result]


class FrameRouter(Protocol):
    """Where a camera's frame may go instead of the local queue, and who keeps a local frame's image for
    a second opinion on its verdict: `fleet/offload`'s Offloader, seen by capture only through this."""

    @property
    def engages_on_queue_full(self) -> bool: ...

    def route(self, camera: str, gate: GateDecision) -> str | None: ...  # a reason to send it away, or None

    def take(self, request: InspectionRequest, reason: str) -> Future[Result]: ...  # never blocks

    def hold(self, request: InspectionRequest) -> None: ...  # before the local queue: keep its image, tag it

    def release(self, request: InspectionRequest) -> None: ...  # the local queue refused it: forget the image
