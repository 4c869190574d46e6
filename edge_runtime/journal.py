"""The result journal: every Result lands in SQLite (WAL) before anything else sees it.

Rows carry a `sent` flag for the MQTT outbox, which publishes from here and marks rows only when the
broker acknowledged them; retention never deletes an unsent row while an outbox is attached.
`synchronous=FULL` makes a committed verdict survive power loss, not only a killed process.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from .result import Result

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


class Journal:
    """Thread-safe: one connection guarded by a lock (SQLite serialises writers anyway)."""

    def __init__(self, path: Path, max_rows: int = 100_000, max_age_days: float = 30,
                 keep_unsent: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_rows, self.max_age_s = max_rows, max_age_days * 86400
        self.keep_unsent = keep_unsent
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._added = 0

    def add(self, result: Result) -> int:
        """Persist one result; returns its journal sequence number."""
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO results (id, ts, created, camera, body) VALUES (?, ?, ?, ?, ?)",
                (result.id, result.ts, time.time(), result.camera, result.to_json()))
            self._added += 1
            if self._added % 100 == 0:
                self._apply_retention()
            return int(cur.lastrowid or 0)

    def get(self, result_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT body FROM results WHERE id = ?", (result_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def query(self, camera: str | None = None, since: str | None = None, until: str | None = None,
              limit: int = 50, before_seq: int | None = None) -> list[dict[str, Any]]:
        """Newest first. `since`/`until` are RFC 3339 timestamps; `before_seq` pages backwards."""
        where: list[str] = []
        args: list[str | int] = []
        if camera:
            where.append("camera = ?")
            args.append(camera)
        if since:
            where.append("ts >= ?")
            args.append(since)
        if until:
            where.append("ts < ?")
            args.append(until)
        if before_seq is not None:
            where.append("seq < ?")
            args.append(before_seq)
        sql = "SELECT seq, body FROM results"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq DESC LIMIT ?"
        args.append(max(1, min(limit, 1000)))
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [{**json.loads(body), "journal_seq": seq} for seq, body in rows]

    def unsent(self, after_seq: int = 0, limit: int = 100) -> list[tuple[int, str, str]]:
        """(seq, camera, body JSON) of results not yet acknowledged by the broker, oldest first."""
        with self._lock:
            return self._db.execute(
                "SELECT seq, camera, body FROM results WHERE sent = 0 AND seq > ? ORDER BY seq LIMIT ?",
                (after_seq, limit)).fetchall()

    def mark_sent(self, seqs: list[int]) -> None:
        if not seqs:
            return
        with self._lock, self._db:  # one transaction: one fsync for the whole batch
            self._db.execute("BEGIN")
            self._db.executemany("UPDATE results SET sent = 1 WHERE seq = ?", [(s,) for s in seqs])

    def counts(self) -> dict[str, int]:
        with self._lock:
            total, unsent = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(sent = 0), 0) FROM results").fetchone()
        return {"total": int(total), "unsent": int(unsent)}

    def _apply_retention(self) -> None:
        keep = "sent = 1 AND " if self.keep_unsent else ""
        self._db.execute(f"DELETE FROM results WHERE {keep}created < ?", (time.time() - self.max_age_s,))
        self._db.execute(
            f"DELETE FROM results WHERE {keep}seq <= (SELECT seq FROM results ORDER BY seq DESC "
            "LIMIT 1 OFFSET ?)", (self.max_rows,))

    def apply_retention(self) -> None:
        with self._lock:
            self._apply_retention()

    def close(self) -> None:
        with self._lock:
            self._db.close()
