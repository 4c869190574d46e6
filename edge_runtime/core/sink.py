"""The one interface for everything that consumes a journaled verdict.

The webhook outbox, MQTT, the API's event stream and metrics, the line I/O stations and offload's
escalation (second opinions) are sinks; the daemon holds them as one list, `app/daemon.py:Daemon.sinks`
(Frigate's `Communicator` and its `comms: list[...]` are the model). A sink whose messages must be as
durable as the verdict (a rule's webhook) has them staged in the journal's transaction by the verdict
stage (the outbox pattern, `verdicts/stage.py`) and only delivers them: its `notify` is the wake-up
after the commit. A sink that needs more than the committed `Result` (escalation needs the frame)
keeps it itself, bounded, under a tag that travels on the request and comes back on the result
(`InspectionRequest.offload_tag`, as a line job's `LineTag`).
A sink is told about a result only after the result is committed to the journal, so a sink that
falls behind or fails never loses a verdict: it catches up from the journal or its own queue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from edge_runtime.core.result import Result


@dataclass(frozen=True)
class SinkHealth:
    """What `/healthz` and the status page show for one sink; `ok=False` makes the device degraded."""

    ok: bool
    detail: str = ""
    counters: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Sink(Protocol):
    """A consumer of journaled verdicts. `notify` runs on the delivery thread: it must return at
    once (enqueue, never block on the network) and must not raise; a slow receiver stays the sink's
    own problem and shows in `health()`."""

    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def notify(self, result: Result) -> None: ...

    def health(self) -> SinkHealth: ...


ResultListener = Callable[[Result], None]


class ResultJournal(Protocol):
    """Where the worker writes each verdict before anyone sees it (`verdicts.journal.Journal`)."""

    def refusing(self) -> bool: ...  # full, and the next trial write is not due: refuse at once

    def add(self, result: Result, extra: Callable[[Any], None] | None = None) -> int: ...  # StorageFull
