"""The line job store's group-commit writer is supervised: a fault in it fails the writes it held
(none waits forever), it restarts, the store reports itself degraded meanwhile, and writes land again."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.verdicts import line_jobs
from edge_runtime.verdicts.line_jobs import LineJobs


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[LineJobs]:
    store = LineJobs(tmp_path / "journal.sqlite3")
    yield store
    store.close()


def on_disk(path: Path, seq: int) -> bool:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT 1 FROM line_jobs WHERE station = 'st1' AND seq = ?", (seq,)).fetchone() is not None


def test_a_cancelled_write_does_not_strand_the_rest_of_its_batch(jobs: LineJobs, tmp_path: Path) -> None:
    """A caller may cancel the Future it got (asyncio.wrap_future does when its task is cancelled);
    set_result on it raised on the writer's thread and the batch's other Futures never completed."""
    with jobs._flushing:  # hold the writer so both writes go in one batch
        first = jobs.triggered("st1", 1, "p1", "")
        second = jobs.triggered("st1", 2, "p2", "")
        assert first.cancel()
    assert second.result(timeout=10) is None
    assert jobs.threads()[0].restarts == 0 and jobs.fault() is None
    assert on_disk(tmp_path / "journal.sqlite3", 2)


def test_a_fault_in_the_writer_fails_its_writes_restarts_and_shows_degraded(
        jobs: LineJobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = LineJobs._commit_batch
    calls = {"n": 0}

    def broken_once(self: LineJobs, batch: list[Any]) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected writer fault")
        return real(self, batch)

    monkeypatch.setattr(LineJobs, "_commit_batch", broken_once)
    held = jobs.triggered("st1", 1, "p1", "")
    with pytest.raises(RuntimeError, match="injected writer fault"):
        held.result(timeout=10)  # failed, not left pending: the station refuses it and the line sees no job
    deadline = time.monotonic() + 10
    while jobs.threads()[0].restarts == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert jobs.threads()[0].restarts == 1
    fault = jobs.fault()
    assert fault is not None and "restarted 1 time(s)" in fault and "injected writer fault" in fault
    assert jobs.triggered("st1", 2, "p2", "").result(timeout=10) is None  # the restarted writer commits
    assert on_disk(tmp_path / "journal.sqlite3", 2) and not on_disk(tmp_path / "journal.sqlite3", 1)
    monkeypatch.setattr(line_jobs, "DEGRADED_S", 0.0)
    assert jobs.fault() is None  # the restart has aged out


def test_a_write_waiting_on_a_stuck_disk_shows_as_stalled(jobs: LineJobs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(line_jobs, "STALLED_S", 0.05)
    with jobs._lock:  # the connection held, as by a commit on a disk that does not answer
        write = jobs.triggered("st1", 1, "p1", "")
        time.sleep(0.2)
        fault = jobs.fault()
        assert fault is not None and "waited" in fault and "for the disk" in fault
    write.result(timeout=10)
    assert jobs.fault() is None
