"""The one delivery path of a verdict: hooks, the journal row, counters, the log line, the sinks.

The inspection worker and the offload workers both hand their results here (`deliver`), so a remote
verdict is journaled and published exactly like a local one. One result at a time: the verdict hooks
(evidence, the rules' staged side effects) keep per-result state from before the journal row to
after its commit. A sink hears of a result only once it is committed (a crash cannot publish a
verdict the journal lost), and a sink that raises never stops the others.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import numpy as np

from edge_runtime.core.inspection_queue import InspectionRequest, ScheduleStats
from edge_runtime.core.result import Result
from edge_runtime.core.sink import ResultJournal, ResultListener, Sink, SinkHealth
from edge_runtime.core.supervise import RateLimitedLog

log = logging.getLogger(__name__)


class VerdictStage(Protocol):
    """What runs around the journal row of a journaled result (`verdicts/stage.py:VerdictServices`)."""

    def before_journal(self, image: np.ndarray | None, result: Result) -> None: ...  # evidence, rules; never raises

    def in_journal(self, db: sqlite3.Connection, result: Result) -> None: ...  # its actions' rows, same transaction

    def after_journal(self, result: Result) -> None: ...  # wake-ups after the commit


class VerdictPipeline:
    def __init__(self, journal: ResultJournal, stats_for: Callable[[str], ScheduleStats | None],
                 stage: VerdictStage | None = None, sinks: list[Sink] | None = None) -> None:
        self.journal = journal
        self.stats_for = stats_for
        self.stage = stage
        self.sinks: list[Sink] = sinks if sinks is not None else []
        self.delivered = 0
        self.sink_errors = Counter[str]()  # notify() raised: counted per sink, the others went on
        self._lock = threading.Lock()
        self._sink_log = RateLimitedLog(log)

    def deliver(self, request: InspectionRequest, result: Result) -> Result:
        """Journal first (durable before anyone else sees it), then counters, log and sinks.
        Raises StorageFull when the journal refuses the row: then no sink sees this verdict."""
        with self._lock:
            if request.line is not None:  # a line job's result carries station, part id, recipe and job id
                tag = request.line
                result.station, result.part_id, result.recipe, result.inspection_seq = \
                    tag.station, tag.part_id, tag.recipe, tag.seq
            result.offload_tag = request.offload_tag  # escalation's key for the frame's image (a sink reads it)
            if request.journal and self.stage is not None:
                stage = self.stage
                stage.before_journal(request.image, result)  # the image the model saw (ROI crop)
                # The result row and the rows of its side effects (alerts, webhooks, review marks) in one
                # transaction; raises StorageFull: then nobody sees this verdict and nothing is queued.
                self.journal.add(result, extra=lambda db: stage.in_journal(db, result))
                stage.after_journal(result)
            elif request.journal:
                self.journal.add(result)
            self.delivered += 1
            stats = self.stats_for(request.camera)
            if stats:
                stats.inspected += 1
                stats.failing = 0
                stats.last_result = result.to_dict()
            log.info("result %s camera=%s verdict=%s total=%.0fms", result.id, result.camera,
                     json.dumps(result.verdict, ensure_ascii=False), result.timings_ms["total"])
            for sink in list(self.sinks):
                try:
                    sink.notify(result)
                except Exception:  # noqa: BLE001 - one broken sink must not keep the verdict from the others
                    self.sink_errors[sink.name] += 1
                    self._sink_log.log(logging.ERROR, "sink %s failed on a result", sink.name, exc_info=True)
            return result

    def health(self) -> dict[str, SinkHealth]:
        """Each sink's own health; one that cannot answer counts as unhealthy, never as an error here."""
        out: dict[str, SinkHealth] = {}
        for sink in list(self.sinks):
            try:
                out[sink.name] = sink.health()
            except Exception as exc:  # noqa: BLE001 - health must answer whatever a sink does
                out[sink.name] = SinkHealth(False, f"health check failed: {type(exc).__name__}")
        return out


class CallbackSink:
    """A plain function as a sink (the API's metrics and event stream subscribe this way)."""

    def __init__(self, name: str, callback: ResultListener) -> None:
        self.name = name
        self.callback = callback

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def notify(self, result: Result) -> None:
        self.callback(result)

    def health(self) -> SinkHealth:
        return SinkHealth(True)
