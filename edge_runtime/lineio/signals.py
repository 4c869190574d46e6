"""The line's signal model, shared by the station and every protocol adapter (docs/line-io.md):
`LineOutcome` (the OK/NOK a station shows), the `Signals` snapshot, refusals, what a job asks of the
capture side, and the job store's interface."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

from edge_runtime.core.result import Result
from edge_runtime.verdicts.line_jobs import StoredJob

# DefectCode values the station itself gives (a NOK verdict gives 1 or its defect_code_field).
DEFECT_NOK = 1
DEFECT_TIMEOUT = 900  # no verdict by result_deadline_ms
DEFECT_NO_FRAME = 901  # the camera gave no new frame in time (or is down)
DEFECT_INTERRUPTED = 902  # the daemon stopped between trigger and verdict
DEFECT_INSPECTION_FAILED = 903  # the inspection raised (queue full, disk full, model error)
DEFECT_NO_VERDICT = 904  # the model's answer held no verdict
DEFECT_UNDECIDED = 905  # the NOK rule could not be evaluated (a regex condition did not finish)
HEARTBEAT_MOD = 1 << 16


class LineOutcome(IntEnum):
    NONE = 0
    OK = 1
    NOK = 2
    ERROR = 3  # counts as NOK on the line


@dataclass(frozen=True)
class Signals:
    """Everything the device shows the line, one consistent snapshot. While `result_valid`,
    inspection_seq/part_id/recipe/result/defect_code are the FIFO head's; otherwise they are the
    last trigger's, with result NONE."""

    trigger_enable: bool
    ready: bool
    trigger_ack: bool
    busy: bool
    acquisition_done: bool
    result_valid: bool
    inspection_seq: int
    part_id: str
    recipe: str
    result: LineOutcome
    defect_code: int
    heartbeat: int
    fault: bool
    buffer_count: int
    overrun: bool


class LineRefused(Exception):
    """A trigger the station did not take; `reason` is one of the documented words."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # not_ready | disabled | busy | overrun | bad_part_id | bad_recipe


@dataclass(frozen=True)
class JobRequest:
    """What the capture side needs to inspect one triggered part."""

    station: str
    seq: int
    part_id: str
    recipe: str
    camera: str
    prompt: str | None
    deadline: float  # time.monotonic() by which the frame must be taken
    schema: dict[str, Any] | None = None  # the recipe's verdict schema (None: the bundle's)
    program: str | None = None  # the recipe's (or station's) inspection program (None: the camera's)


class JobStore(Protocol):
    """Where triggers, outcomes and acks are made durable (verdicts/line_jobs.py). A write returns at
    once; its Future is done when it is on disk (callbacks may run on the store's writer thread)."""

    def triggered(self, station: str, seq: int, part_id: str, recipe: str) -> Future[None]: ...

    def decided(self, station: str, seq: int, result: int, defect_code: int,
                result_id: str | None) -> Future[None]: ...

    def acked(self, station: str, seq: int) -> Future[None]: ...

    def wait(self, future: Future[Any]) -> Any: ...  # future.result(), safe on the writer's own thread

    def open_jobs(self, station: str) -> list[StoredJob]: ...

    def last_seq(self, station: str) -> int: ...

    def journaled_result(self, station: str, seq: int) -> Result | None: ...


# start(job, on_acquired) takes the frame (may block until job.deadline), calls on_acquired() the moment
# it is taken, and returns the Future of the journaled Result; raising means no frame.
StartJob = Callable[[JobRequest, Callable[[], None]], "Future[Result]"]
