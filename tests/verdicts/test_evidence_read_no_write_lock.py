"""A read of a result's evidence (the image route, GET /api/v1/results/<id>) never waits for SQLite's
write lock while holding the store's lock, and never fails for a mark it could not write.

`still_kept` held `EvidenceStore._lock` and ran an UPDATE of the result's journal row for every result
without an evidence row (the ordinary 404 for a sampled pass): a no-op UPDATE still needs SQLite's
write lock, so an unauthenticated image GET could wait 30 s behind a writer holding the lock `save()`
needs for every verdict, and GET /api/v1/results/<id> could end in a 500 on the busy timeout."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from edge_runtime.verdicts.queries import VerdictQueries
from edge_runtime.verdicts.stage import VerdictServices
from tests.verdicts.test_evidence import result
from tests.verdicts.test_evidence_removed_marked import _inspect, _line


def _writer(path: Path) -> sqlite3.Connection:
    """Another connection holding SQLite's write lock (a journal write, a checkpoint) until rolled back."""
    db = sqlite3.connect(str(path), isolation_level=None, timeout=30)
    db.execute("BEGIN IMMEDIATE")
    return db


def _in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    thread.start()
    return thread, out


def test_a_result_never_kept_is_checked_without_a_write(tmp_path: Path) -> None:
    journal, store = _line(tmp_path, max_mb=100)
    journal.add(result(5))  # a sampled pass: no image, no evidence row
    writer = _writer(tmp_path / "j.sqlite3")
    try:
        t0 = time.monotonic()
        thread, out = _in_thread(store.still_kept, "r5")
        thread.join(3)
        assert not thread.is_alive(), "still_kept waited for SQLite's write lock for a result with no image"
        assert out == [False] and time.monotonic() - t0 < 1
    finally:
        writer.execute("ROLLBACK")
        thread.join(40)


def test_marking_an_image_found_missing_does_not_hold_the_store_lock(tmp_path: Path) -> None:
    journal, store = _line(tmp_path, max_mb=100)
    for i in range(2):
        _inspect(journal, store, i)
    found = store.lookup("r1")
    assert found is not None
    found.path.unlink()  # a technician's rm
    writer = _writer(tmp_path / "j.sqlite3")
    try:
        thread, out = _in_thread(store.still_kept, "r1")
        time.sleep(0.3)  # the read is waiting for the write lock now
        got = store._lock.acquire(timeout=0.5)  # what save() needs for every verdict
        assert got, "the read held the store's lock while waiting for SQLite's write lock"
        store._lock.release()
        thread.join(5)
        assert not thread.is_alive() and out == [False]  # gave up on the mark after a short wait
    finally:
        writer.execute("ROLLBACK")
        thread.join(40)
    assert journal.get("r1")["evidence"]["uri"] is not None  # type: ignore[index]  # not written yet
    assert not store.still_kept("r1")  # the next read marks it
    assert journal.get("r1")["evidence"]["removed"]["why"] == "missing"  # type: ignore[index]


def test_get_result_answers_removed_when_the_mark_cannot_be_written(tmp_path: Path) -> None:
    journal, store = _line(tmp_path, max_mb=100)
    _inspect(journal, store, 0)
    found = store.lookup("r0")
    assert found is not None
    found.path.unlink()
    services = SimpleNamespace(evidence=store)
    services.evidence_removal = lambda rid: VerdictServices.evidence_removal(services, rid)  # type: ignore[arg-type]
    queries = VerdictQueries(journal, services, lambda: None)  # type: ignore[arg-type, return-value]
    writer = _writer(tmp_path / "j.sqlite3")
    try:
        thread, out = _in_thread(queries.get_result, "r0")
        thread.join(5)
        assert not thread.is_alive(), "GET /api/v1/results/<id> waited for SQLite's write lock"
    finally:
        writer.execute("ROLLBACK")
        thread.join(40)
    assert out, "get_result raised"
    evidence = out[0]["evidence"]
    assert evidence["uri"] is None and evidence["removed"]["why"] == "missing", evidence
