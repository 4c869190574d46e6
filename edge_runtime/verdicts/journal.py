"""The result journal: every Result lands in SQLite (WAL) before anything else sees it.

Rows carry a `sent` state for the MQTT outbox, which publishes from here and marks rows only when the
broker acknowledged them; retention never deletes an unsent row while an outbox is attached. A row
that can never be published (a poison row) is *parked* with a reason so it cannot block the rest.
`synchronous=FULL` makes a committed verdict survive power loss, not only a killed process.

A full disk raises `StorageFull` (the verdict is not journaled, so it is not published either); the
journal then refuses at once, trying a real write again every `retry_s`, and heals when one succeeds.
Before it comes to that, a free-space watermark deletes the oldest delivered rows and truncates the WAL.
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_runtime.core.errors import StorageFull
from edge_runtime.core.result import Result
from edge_runtime.core.result_filter import ResultFilter
from edge_runtime.verdicts.database import is_full, open_db
from edge_runtime.verdicts.result_query import select_results

log = logging.getLogger(__name__)
PRUNE_LOG_EVERY_S = 60.0  # the "deleted the oldest" line: once, then at most this often, with a count

UNSENT, SENT, PARKED = 0, 1, 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    id       TEXT NOT NULL UNIQUE,
    ts       TEXT NOT NULL,
    created  REAL NOT NULL,
    camera   TEXT NOT NULL,
    body     TEXT NOT NULL,
    sent     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS results_camera ON results (camera, seq);
CREATE INDEX IF NOT EXISTS results_unsent ON results (sent, seq);
CREATE INDEX IF NOT EXISTS results_created ON results (created);
"""

class _SideEffectsLost(Exception):
    """`extra` failed in a way that made SQLite roll back the whole transaction, result row included."""


class Journal:
    """Thread-safe: one connection guarded by a lock (SQLite serialises writers anyway)."""

    def __init__(self, path: Path, max_rows: int = 100_000, max_age_days: float = 30,
                 keep_unsent: bool = True, min_free_mb: float = 0.0, retry_s: float = 1.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.set_limits(max_rows, max_age_days, min_free_mb)
        self.keep_unsent = keep_unsent
        self.retry_s = retry_s
        self.full_since: float | None = None  # monotonic time the disk was found full; None: writable
        self.free_bytes: int | None = None
        self.pruned = 0  # delivered rows deleted early to keep the watermark
        self.escaped = 0  # results whose JSON held a lone surrogate: stored with \\uXXXX escapes instead
        self.resyncs = 0  # counts found wrong (rows changed by another process) and recounted
        self._pruned_unlogged = 0
        self._prune_logged = 0.0  # monotonic time of the last "deleted oldest" line (rate-limited)
        self._last_try = 0.0
        self._next_space_check = 0.0
        self._next_checkpoint = time.monotonic() + 60
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._reader: sqlite3.Connection | None = None
        self._db = open_db(path, _SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(results)")}
        if "reason" not in columns:  # journals written before parking existed
            self._db.execute("ALTER TABLE results ADD COLUMN reason TEXT")
        for name in ("station", "part_id", "recipe"):  # line I/O (docs/line-io.md); older journals lack them
            if name not in columns:
                self._db.execute(f"ALTER TABLE results ADD COLUMN {name} TEXT")
        self._db.execute("CREATE INDEX IF NOT EXISTS results_station ON results (station, seq) "
                         "WHERE station IS NOT NULL")
        self._added = 0
        self._recount()

    # ---- writes ------------------------------------------------------------------------------

    def set_limits(self, max_rows: int, max_age_days: float, min_free_mb: float) -> None:
        """Retention and the free-space floor (at start, and on a reload from the next write on)."""
        self.max_rows, self.max_age_s = max_rows, max_age_days * 86400
        self.min_free_bytes = int(min_free_mb * 1024 * 1024)

    @property
    def full(self) -> bool:
        return self.full_since is not None

    def refusing(self) -> bool:
        """Full, and the next trial write is not due yet: refuse without costing anything."""
        return self.full_since is not None and time.monotonic() - self._last_try < self.retry_s

    def add(self, result: Result, extra: Callable[[sqlite3.Connection], None] | None = None) -> int:
        """Persist one result; returns its journal sequence number. Raises StorageFull.

        `extra(db)` runs on the journal's connection inside the same transaction, so rows it inserts
        (the alerts, webhooks and review marks of fired rules) are durable together with the result or
        not at all: no crash can leave a journaled result whose side effects were never queued."""
        with self._lock:
            now = time.monotonic()
            if self.full_since is not None and now - self._last_try < self.retry_s:
                raise StorageFull("disk full: the journal cannot store results")
            self._last_try = now
            self._keep_watermark(now)
            try:
                try:
                    seq = self._insert(result, extra)
                except _SideEffectsLost as lost:
                    # An error in a side effect that made SQLite roll back the whole transaction (not
                    # a full disk: that is StorageFull below). The verdict matters more: keep it alone.
                    log.error("journal: the rule actions of result %s could not be stored (%s); "
                              "the result is journaled without them", result.id, lost.__cause__)
                    seq = self._insert(result, None)
            except sqlite3.OperationalError as exc:
                if not is_full(exc):
                    raise
                self._went_full(exc)
                raise StorageFull(f"disk full: the journal cannot store results ({exc})") from None
            if self.full_since is not None:
                log.info("journal: writable again after %.1f s", now - self.full_since)
                self.full_since = None
            self._total += 1
            self._unsent += 1
            self._added += 1
            if self._added % 100 == 0:
                self._housekeeping(self._apply_retention)
            return seq

    def _insert(self, result: Result, extra: Callable[[sqlite3.Connection], None] | None) -> int:
        """One transaction (one fsync): the result row and whatever `extra` adds; all or nothing."""
        # IMMEDIATE takes the write lock now: the outboxes' own connections write to this file too,
        # and a deferred transaction that must upgrade its lock can fail with SQLITE_BUSY at once.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            cur = self._db.execute(
                "INSERT INTO results (id, ts, created, camera, body, station, part_id, recipe) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (result.id, result.ts, time.time(), result.camera, self._body(result), result.station,
                 result.part_id, result.recipe))
            if extra is not None:
                try:
                    extra(self._db)
                except sqlite3.Error as exc:
                    if is_full(exc) or self._db.in_transaction:
                        raise
                    raise _SideEffectsLost() from exc  # SQLite already rolled everything back
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                try:
                    self._db.execute("ROLLBACK")
                except sqlite3.Error as exc:  # SQLite already rolled back (e.g. after a full disk)
                    log.debug("journal: rollback: %s", exc)
            raise
        return int(cur.lastrowid or 0)

    def _body(self, result: Result) -> str:
        """The result's JSON; one holding a lone surrogate (e.g. a local model's text) cannot be stored
        as UTF-8, so it is stored ASCII-escaped (`\\udXXX`, still valid JSON), counted and logged once."""
        body = result.to_json()
        try:
            body.encode("utf-8")
        except UnicodeEncodeError:
            body = json.dumps(result.to_dict(), separators=(",", ":"), ensure_ascii=True)
            self.escaped += 1
            if self.escaped == 1 or self.escaped % 1000 == 0:
                log.warning("journal: result %s holds text that is not valid Unicode (a lone surrogate); "
                            "stored escaped (%d so far)", result.id, self.escaped)
        return body

    def _resync_if_wrong(self) -> None:
        """Another process may insert or change rows: a count that would go negative is recounted."""
        if self._unsent < 0 or self._parked < 0 or self._total < 0:
            self.resyncs += 1
            log.debug("journal: counts out of step with the database; recounting")
            self._recount()

    def mark_sent(self, seqs: list[int]) -> None:
        """Raises StorageFull: the caller keeps the seqs and marks them later."""
        if not seqs:
            return
        with self._lock:
            try:
                with self._db:  # one transaction: one fsync for the whole batch
                    self._db.execute("BEGIN")
                    cur = self._db.executemany(
                        f"UPDATE results SET sent = {SENT} WHERE seq = ? AND sent = {UNSENT}",
                        [(s,) for s in seqs])
            except sqlite3.OperationalError as exc:
                if is_full(exc):
                    raise StorageFull(f"disk full: cannot mark results delivered ({exc})") from None
                raise
            self._unsent -= max(cur.rowcount, 0)
            self._resync_if_wrong()

    def park(self, seq: int, reason: str) -> None:
        """Set a row aside that can never be published, so the outbox moves on; counted and visible."""
        with self._lock:
            cur = self._db.execute(f"UPDATE results SET sent = {PARKED}, reason = ? WHERE seq = ? "
                                   f"AND sent = {UNSENT}", (reason[:500], seq))
            if cur.rowcount > 0:
                self._unsent -= 1
                self._parked += 1
                self._resync_if_wrong()

    def _went_full(self, exc: sqlite3.Error) -> None:
        if self.full_since is None:
            self.full_since = time.monotonic()
            self._housekeeping(self._prune_delivered)  # may free pages for the next try
        del exc

    # ---- space -------------------------------------------------------------------------------

    def _keep_watermark(self, now: float) -> None:
        """Every few seconds: below the free-space watermark, delete the oldest delivered rows."""
        if now >= self._next_checkpoint:
            self._next_checkpoint = now + 60
            self._housekeeping(self._checkpoint)
        if now < self._next_space_check and self._added % 50:
            return  # every 2 s, and every 50 rows (a fast camera fills a small disk between checks)
        self._next_space_check = now + 2.0
        try:
            self.free_bytes = shutil.disk_usage(self.path.parent).free
        except OSError:
            return
        if self.free_bytes < self.min_free_bytes:
            self._housekeeping(self._prune_delivered)

    def _prune_delivered(self) -> None:
        deletable = f"sent != {UNSENT}" if self.keep_unsent else "1"
        n = max(100, (self._total - self._unsent) // 10) if self.keep_unsent else max(100, self._total // 10)
        cur = self._db.execute(f"DELETE FROM results WHERE seq IN (SELECT seq FROM results WHERE "
                               f"{deletable} ORDER BY seq LIMIT ?)", (n,))
        if cur.rowcount > 0:
            self.pruned += cur.rowcount
            self._pruned_unlogged += cur.rowcount
            now = time.monotonic()
            if self._prune_logged == 0.0 or now - self._prune_logged >= PRUNE_LOG_EVERY_S:
                log.warning("journal: free space below %d MB: deleted the %d oldest delivered results "
                            "(%d in all; logged at most every %.0f s)", self.min_free_bytes // (1024 * 1024),
                            self._pruned_unlogged, self.pruned, PRUNE_LOG_EVERY_S)
                self._prune_logged, self._pruned_unlogged = now, 0
            self._recount()
        self._checkpoint()

    def _checkpoint(self) -> None:
        # The WAL only grows while nobody truncates it; TRUNCATE hands its space back to the disk.
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()

    def _housekeeping(self, job: Any) -> None:
        """Retention, pruning and checkpoints may fail on a full disk; the verdict is already safe."""
        try:
            job()
        except sqlite3.Error as exc:
            log.debug("journal: housekeeping failed: %s", exc)

    def _apply_retention(self) -> None:
        keep = f"sent != {UNSENT} AND " if self.keep_unsent else ""
        self._db.execute(f"DELETE FROM results WHERE {keep}created < ?", (time.time() - self.max_age_s,))
        self._db.execute(
            f"DELETE FROM results WHERE {keep}seq <= (SELECT seq FROM results ORDER BY seq DESC "
            "LIMIT 1 OFFSET ?)", (self.max_rows,))
        self._recount()

    def apply_retention(self) -> None:
        with self._lock:
            self._apply_retention()

    def _recount(self) -> None:
        total, unsent, parked = self._db.execute(
            f"SELECT COUNT(*), COALESCE(SUM(sent = {UNSENT}), 0), COALESCE(SUM(sent = {PARKED}), 0) "
            "FROM results").fetchone()
        self._total, self._unsent, self._parked = int(total), int(unsent), int(parked)

    # ---- reads -------------------------------------------------------------------------------

    def get(self, result_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT body FROM results WHERE id = ?", (result_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def query(self, camera: str | None = None, since: str | None = None, until: str | None = None,
              limit: int = 50, before_seq: int | None = None) -> list[dict[str, Any]]:
        """Newest first. `since`/`until` are RFC 3339 timestamps; `before_seq` pages backwards."""
        f = ResultFilter(camera=camera, since=since, until=until, before=before_seq, limit=max(1, min(limit, 1000)))
        # On a connection of its own: a page of a large journal never holds back add() (WAL readers do not
        # block the writer); opened on first use, after the schema is in place.
        with self._read_lock:
            if self._reader is None:
                self._reader = open_db(self.path)
            return select_results(self._reader, f)[0]

    def unsent(self, after_seq: int = 0, limit: int = 100) -> list[tuple[int, str, str]]:
        """(seq, camera, body JSON) of results not yet acknowledged by the broker, oldest first."""
        with self._lock:
            return self._db.execute(
                f"SELECT seq, camera, body FROM results WHERE sent = {UNSENT} AND seq > ? ORDER BY seq "
                "LIMIT ?", (after_seq, limit)).fetchall()

    def parked(self, limit: int = 20) -> list[tuple[int, str, str]]:
        """(seq, camera, reason) of set-aside rows, newest first."""
        with self._lock:
            return self._db.execute(f"SELECT seq, camera, reason FROM results WHERE sent = {PARKED} "
                                    "ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()

    def counts(self) -> dict[str, int]:
        """Kept incrementally and read without the lock: status and telemetry call this often, and a
        COUNT(*) per call (or waiting behind an fsync) did not scale."""
        return {"total": max(self._total, 0), "unsent": max(self._unsent, 0), "parked": max(self._parked, 0)}

    def integrity_check(self) -> str:
        with self._lock:
            return str(self._db.execute("PRAGMA integrity_check").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
        with self._read_lock:
            if self._reader is not None:
                self._reader.close()
