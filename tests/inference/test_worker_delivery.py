"""Delivery of verdicts is one result at a time: the offload workers call the worker's delivery while
the inspection worker does too, and the verdict hooks keep per-result state from before the journal
row to after its commit (a rule's staged alert and webhook wake-up). Real journal (SQLite)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from edge_runtime.core.contracts import OpenGate
from edge_runtime.core.inspection_queue import InspectionQueue, InspectionRequest
from edge_runtime.core.result import Result
from edge_runtime.inference.worker import InspectionWorker
from edge_runtime.verdicts.journal import Journal
from tests.verdicts.test_journal import make_result


def test_deliveries_from_several_threads_never_interleave_their_hooks(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    worker = InspectionWorker(InspectionQueue(4), lambda: None, journal, OpenGate(), lambda _camera: None)
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

    worker.before_journal.append(before)
    worker.after_journal.append(after)

    def deliver(camera: str) -> None:
        for n in range(10):
            worker._deliver(InspectionRequest(None, camera), make_result(camera, n))

    threads = [threading.Thread(target=deliver, args=(f"cam{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    journal.close()
    assert overlaps == []
    assert worker.inspected == 30
