"""Messages the verdict stage queues for MQTT (alerts, reviews), kept in the journal's SQLite file:
`verdicts/messages.py:MessageQueue` is the interface it stages them through.

The MQTT service (`client.py`) drains this table beside the results: a row is marked sent only on PUBACK, so an
alert or a review survives a broker outage and a `kill -9` exactly like a verdict does.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from edge_runtime.verdicts.database import open_db
from edge_runtime.verdicts.messages import MAX_PAYLOAD

_SCHEMA = """
CREATE TABLE IF NOT EXISTS mqtt_outbox (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    topic    TEXT NOT NULL,            -- below the device prefix, e.g. line-1/alert
    payload  TEXT NOT NULL,
    created  REAL NOT NULL,
    sent     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS mqtt_outbox_unsent ON mqtt_outbox (sent, seq);
"""
log = logging.getLogger(__name__)


class MessageOutbox:
    """(topic, payload) rows waiting for the broker; `notify` calls `wake` (the MQTT service's wake-up)."""

    def __init__(self, path: Path, max_rows: int = 100_000, wake: Callable[[], None] = lambda: None) -> None:
        self.max_rows = max_rows
        self.dropped_unsent = 0  # undelivered messages given up to keep the table within max_rows
        self._drop_logged_at = -60.0
        self._wake = wake
        self._lock = threading.Lock()
        self._db = open_db(path, _SCHEMA)

    def notify(self) -> None:
        """Rows were committed: wake whoever sends them."""
        self._wake()

    def put(self, topic: str, payload: str) -> int:
        with self._lock, self._db:
            self._db.execute("BEGIN")
            seq = self.stage(self._db, topic, payload)
        self.notify()
        return seq

    def stage(self, db: sqlite3.Connection, topic: str, payload: str) -> int:
        """Insert one message on `db` (the caller's transaction, e.g. the journal's: the message is then
        durable exactly when the result is). The caller calls `notify` after its commit. Raises
        ValueError for an oversized payload before touching the database."""
        if len(payload) > MAX_PAYLOAD:
            raise ValueError(f"message for {topic} is larger than {MAX_PAYLOAD} bytes")
        cur = db.execute("INSERT INTO mqtt_outbox (topic, payload, created) VALUES (?, ?, ?)",
                         (topic, payload, time.time()))
        self._trim(db)
        return int(cur.lastrowid or 0)

    def _trim(self, db: sqlite3.Connection) -> None:
        """Keep at most `max_rows`: the oldest delivered rows go first; undelivered ones (oldest first)
        only when nothing delivered is left, and those are counted and logged."""
        excess = int(db.execute("SELECT COUNT(*) FROM mqtt_outbox").fetchone()[0]) - self.max_rows
        if excess <= 0:
            return
        for sent in (1, 0):  # both deletes walk the (sent, seq) index
            gone = db.execute("DELETE FROM mqtt_outbox WHERE seq IN (SELECT seq FROM mqtt_outbox WHERE sent = ? "
                              "ORDER BY seq LIMIT ?)", (sent, excess)).rowcount
            excess -= gone
            if sent == 0 and gone:
                self.dropped_unsent += gone
                if time.monotonic() >= self._drop_logged_at + 60:  # one line a minute through a long outage
                    self._drop_logged_at = time.monotonic()
                    log.warning("mqtt outbox full (%d rows): %d oldest undelivered messages dropped so far",
                                self.max_rows, self.dropped_unsent)
            if excess <= 0:
                return

    def unsent(self, after_seq: int = 0, limit: int = 100) -> list[tuple[int, str, str]]:
        """(seq, topic below the prefix, payload), oldest first."""
        with self._lock:
            return self._db.execute(
                "SELECT seq, topic, payload FROM mqtt_outbox WHERE sent = 0 AND seq > ? ORDER BY seq LIMIT ?",
                (after_seq, limit)).fetchall()

    def mark_sent(self, seqs: list[int]) -> None:
        if not seqs:
            return
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.executemany("UPDATE mqtt_outbox SET sent = 1 WHERE seq = ?", [(s,) for s in seqs])
            self._db.execute("DELETE FROM mqtt_outbox WHERE sent = 1 AND created < ?", (time.time() - 86400,))

    def backlog(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM mqtt_outbox WHERE sent = 0").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
