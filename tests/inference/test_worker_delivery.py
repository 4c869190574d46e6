"""Delivery of verdicts is one result at a time: the offload workers deliver while the inspection
worker does too, and the verdict hooks keep per-result state from before the journal row to after
its commit (a rule's staged alert and webhook wake-up). A sink sees only journaled verdicts, and one
that raises never keeps a verdict from the others. Real journal (SQLite)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.core.result import Result
from edge_runtime.core.sink import SinkHealth
from edge_runtime.verdicts.journal import Journal
from edge_runtime.verdicts.pipeline import CallbackSink, VerdictPipeline
from tests.verdicts.test_journal import make_result


def test_deliveries_from_several_threads_never_interleave_their_hooks(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    current: list[str] = []  # the result between its before_journal and after_journal hooks
    overlaps: list[tuple[str, str]] = []
    lock = threading.Lock()

    def before(_image: object, result: Result) -> None:
        with lock:
            if current:
                overlaps.append((current[0], result.id))
            current.append(result.id)
        time.sleep(0.01)  # evidence and rules take time: a second delivery would start meanwhile

    def after(result: Result) -> None:
        with lock:
            current.remove(result.id)

    class Stage:  # the verdict stage around the journal row, as the pipeline calls it
        before_journal = staticmethod(before)
        after_journal = staticmethod(after)

        def in_journal(self, _db: object, _result: Result) -> None:
            return None

    pipeline = VerdictPipeline(journal, lambda _camera: None, Stage())

    def deliver(camera: str) -> None:
        for n in range(10):
            pipeline.deliver(InspectionRequest(None, camera), make_result(camera, n))

    threads = [threading.Thread(target=deliver, args=(f"cam{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    journal.close()
    assert overlaps == []
    assert pipeline.delivered == 30


class _Broken:
    name = "broken"

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def notify(self, result: Result) -> None:
        raise RuntimeError("receiver bug")

    def health(self) -> SinkHealth:
        raise RuntimeError("health bug")


def test_a_raising_sink_is_counted_and_the_next_sink_still_sees_only_journaled_verdicts(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    pipeline = VerdictPipeline(journal, lambda _camera: None)
    seen: list[str] = []
    pipeline.sinks += [_Broken(), CallbackSink("after", lambda r: seen.append(r.id))]
    results = [pipeline.deliver(InspectionRequest(None, "cam"), make_result("cam", n)) for n in range(3)]
    assert seen == [r.id for r in results]
    assert all(journal.get(r.id) is not None for r in results)  # journaled before any sink heard of it
    assert pipeline.sink_errors["broken"] == 3
    health = pipeline.health()
    assert health["broken"].ok is False and "health check failed" in health["broken"].detail
    assert health["after"].ok is True
    journal.close()
