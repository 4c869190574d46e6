"""The line's jobs in the journal's file: every trigger, its outcome and its acknowledgement.

A row is written when a station takes a trigger (before TriggerAck), updated when the outcome is
decided (the verdict, a timeout, an error) and when the line acknowledges it. After a restart the
unacknowledged rows are the station's FIFO again; the highest job id continues the numbering, so a
part is never reported twice. The verdict itself is a row of `results` (columns station, part_id,
recipe; the body carries inspection_seq), written by the journal before any station sees it.

Writes are group-committed off the caller's thread: `triggered`, `decided` and `acked` queue a write
and return a Future that is done once it is durable (its transaction committed, synchronous=FULL);
one writer thread commits everything queued meanwhile in one transaction, so a slow disk costs one
fsync per batch, not per write, and nobody waits for it while holding a lock. A station shows a
state to the line only from the Future's callback: what the line can see is already on disk.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_runtime.core.result import Result
from edge_runtime.core.supervise import SupervisedThread
from edge_runtime.verdicts.database import open_db

log = logging.getLogger(__name__)
DEGRADED_S = 60.0  # how long a restart of the writer shows in health
STALLED_S = 10.0  # a write queued this long without a commit: the disk (or the writer) is stuck
KEEP_ACKED = 10_000  # acknowledged jobs kept per station (the results table keeps the verdicts)
MAX_BATCH = 256  # writes per transaction (a station has at most fifo_depth jobs, each a few writes)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS line_jobs (
    station     TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    part_id     TEXT NOT NULL,
    recipe      TEXT NOT NULL,
    triggered   REAL NOT NULL,
    result      INTEGER,
    defect_code INTEGER NOT NULL DEFAULT 0,
    result_id   TEXT,
    decided     REAL,
    acked       REAL,
    PRIMARY KEY (station, seq)
);
CREATE INDEX IF NOT EXISTS line_jobs_open ON line_jobs (station, acked, seq);
"""


@dataclass(frozen=True)
class StoredJob:
    """A job as stored (result None: no outcome was recorded before the daemon stopped)."""

    seq: int
    part_id: str
    recipe: str
    result: int | None = None
    defect_code: int = 0
    result_id: str | None = None


@dataclass
class _Write:
    sql: str
    params: tuple[object, ...]
    future: Future[None]
    prune: str | None = None  # a station whose old acknowledged rows go in the same transaction
    queued: float = field(default_factory=time.monotonic)


class LineJobs:
    """The `JobStore` of `lineio/station/` on SQLite (WAL, synchronous=FULL). Thread-safe."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()  # the connection
        self._db = open_db(path, _SCHEMA)
        self._acks = 0
        self._queue: deque[_Write] = deque()
        self._cond = threading.Condition()
        self._flushing = threading.RLock()  # the writer, or a wait() on the writer's own thread
        self._closing = False
        self._writer_ident: int | None = None
        self._failed_at: float | None = None  # monotonic time of the writer's last failure
        self._committing: float | None = None  # when the oldest write of the batch being committed was queued
        self.commits = 0  # transactions committed (tests and benchmarks: writes per commit)
        self.written = 0
        self._stop = threading.Event()
        self._thread = SupervisedThread("line-jobs-writer", self._write_loop, self._stop, log)
        self._thread.start()

    def close(self) -> None:
        """Commit what is queued, stop the writer, close the file; later writes fail."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._stop.set()
        self._thread.join(30.0)
        self._flush()  # anything queued after the writer's last look
        with self._lock:
            self._db.close()

    def threads(self) -> list[SupervisedThread]:
        return [self._thread]

    def fault(self) -> str | None:
        """Why durable writes may not be landing, for the daemon's health (None: they are): the writer
        is down, restarted in the last DEGRADED_S, or a write has waited STALLED_S for its commit."""
        now = time.monotonic()
        if not self._thread.is_alive() and not self._closing:
            return f"the line job writer is not running ({self._thread.last_error})"
        if self._failed_at is not None and now - self._failed_at < DEGRADED_S:
            return (f"the line job writer restarted {self._thread.restarts} time(s), last "
                    f"{now - self._failed_at:.0f} s ago: {self._thread.last_error}")
        with self._cond:
            waiting = [t for t in (self._committing, self._queue[0].queued if self._queue else None) if t]
        oldest = min(waiting, default=None)
        if oldest is not None and now - oldest > STALLED_S:
            return f"line job writes have waited {now - oldest:.0f} s for the disk"
        return None

    # ---- writes (durable when their Future is done) -----------------------------------------------

    def triggered(self, station: str, seq: int, part_id: str, recipe: str) -> Future[None]:
        return self._submit("INSERT INTO line_jobs (station, seq, part_id, recipe, triggered) VALUES (?, ?, ?, ?, ?)",
                            (station, seq, part_id, recipe, time.time()))

    def decided(self, station: str, seq: int, result: int, defect_code: int, result_id: str | None) -> Future[None]:
        return self._submit("UPDATE line_jobs SET result = ?, defect_code = ?, result_id = ?, decided = ? "
                            "WHERE station = ? AND seq = ? AND result IS NULL",
                            (result, defect_code, result_id, time.time(), station, seq))

    def acked(self, station: str, seq: int) -> Future[None]:
        with self._cond:
            self._acks += 1
            prune = station if self._acks % 500 == 0 else None
        return self._submit("UPDATE line_jobs SET acked = ? WHERE station = ? AND seq = ?",
                            (time.time(), station, seq), prune)

    def wait(self, future: Future[Any]) -> Any:
        """`future.result()`; on the writer's own thread (a Future's callback waiting on a write it
        queued) it commits the queue itself instead of waiting for itself."""
        if not future.done() and threading.get_ident() == self._writer_ident:
            self._flush()
        return future.result()

    def _submit(self, sql: str, params: tuple[object, ...], prune: str | None = None) -> Future[None]:
        write = _Write(sql, params, Future(), prune)
        with self._cond:
            if self._closing and not self._thread.is_alive():
                write.future.set_exception(RuntimeError("the line job store is closed"))
                return write.future
            self._queue.append(write)
            self._cond.notify()
        return write.future

    def _write_loop(self) -> None:
        self._writer_ident = threading.get_ident()
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._closing:
                        self._cond.wait(1.0)
                    if not self._queue and self._closing:
                        return
                self._flush()
        except Exception:
            self._failed_at = time.monotonic()  # health shows it; the supervisor logs and restarts
            raise

    def _flush(self) -> None:
        """Commit everything queued (up to MAX_BATCH writes) in one transaction, then complete their
        Futures (outside the connection's lock: their callbacks may queue and wait for more)."""
        with self._flushing:
            while True:
                with self._cond:
                    batch = [self._queue.popleft() for _ in range(min(len(self._queue), MAX_BATCH))]
                    self._committing = batch[0].queued if batch else None
                if not batch:
                    return
                try:
                    errors = self._commit_batch(batch)
                except BaseException as exc:  # whatever happened, no write of the batch waits forever
                    for write in batch:
                        _complete(write.future, exc)
                    raise
                finally:
                    with self._cond:
                        self._committing = None  # before the callbacks, which may flush inline
                for write, error in zip(batch, errors, strict=True):
                    _complete(write.future, error)

    def _commit_batch(self, batch: list[_Write]) -> list[Exception | None]:
        with self._lock:
            try:
                self._transaction(batch)
                return [None] * len(batch)
            except Exception as exc:  # noqa: BLE001 - a write's failure is its Future's, never the writer's
                if len(batch) == 1:
                    return [exc]
            # One write spoiled the batch (or the disk is full): each on its own, so the others still land.
            errors: list[Exception | None] = []
            for write in batch:
                try:
                    self._transaction([write])
                    errors.append(None)
                except Exception as exc:  # noqa: BLE001 - as above
                    errors.append(exc)
            return errors

    def _transaction(self, batch: list[_Write]) -> None:
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            for write in batch:
                db.execute(write.sql, write.params)
                if write.prune is not None:
                    db.execute("DELETE FROM line_jobs WHERE station = ? AND acked IS NOT NULL AND seq <= "
                               "(SELECT MAX(seq) FROM line_jobs WHERE station = ?) - ?",
                               (write.prune, write.prune, KEEP_ACKED))
            self._commit()
        except BaseException:
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # the connection reports the first error; this one adds nothing
            raise
        self.commits += 1
        self.written += len(batch)

    def _commit(self) -> None:
        self._db.execute("COMMIT")  # the fsync (synchronous=FULL); benchmarks/lineio_durable.py slows it

    # ---- reads (committed state only: the writer holds the connection for a whole transaction) ----

    def open_jobs(self, station: str) -> list[StoredJob]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, part_id, recipe, result, defect_code, result_id FROM line_jobs "
                "WHERE station = ? AND acked IS NULL ORDER BY seq", (station,)).fetchall()
        return [StoredJob(int(r[0]), str(r[1]), str(r[2]), None if r[3] is None else int(r[3]),
                             int(r[4]), r[5]) for r in rows]

    def last_seq(self, station: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT MAX(seq) FROM line_jobs WHERE station = ?", (station,)).fetchone()
        return int(row[0] or 0)

    def journaled_result(self, station: str, seq: int) -> Result | None:
        """The verdict the journal holds for a job (a restart between journal commit and outcome row)."""
        with self._lock:
            try:
                rows = self._db.execute("SELECT body FROM results WHERE station = ? ORDER BY seq DESC LIMIT 64",
                                        (station,)).fetchall()
            except sqlite3.OperationalError:  # no results table yet: nothing was journaled
                return None
        for (body,) in rows:
            data = json.loads(body)
            if data.get("inspection_seq") == seq:
                return Result.from_dict(data)
        return None

    def job(self, station: str, seq: int) -> dict[str, object] | None:
        """One job's row, for the status page and tests."""
        with self._lock:
            cur = self._db.execute("SELECT * FROM line_jobs WHERE station = ? AND seq = ?", (station, seq))
            row = cur.fetchone()
            names = [d[0] for d in cur.description]
        return dict(zip(names, row, strict=True)) if row else None


def _complete(future: Future[None], error: BaseException | None) -> None:
    """Resolve a write's Future; one its caller cancelled is left so (set_result would raise on the
    writer's thread and strand the rest of the batch)."""
    if not future.set_running_or_notify_cancel():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
