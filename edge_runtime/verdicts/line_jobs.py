"""The line's jobs in the journal's file: every trigger, its outcome and its acknowledgement.

A row is written when a station takes a trigger (before TriggerAck), updated when the outcome is
decided (the verdict, a timeout, an error) and when the line acknowledges it. After a restart the
unacknowledged rows are the station's FIFO again; the highest job id continues the numbering, so a
part is never reported twice. The verdict itself is a row of `results` (columns station, part_id,
recipe; the body carries inspection_seq), written by the journal before any station sees it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.core.result import Result
from edge_runtime.verdicts.database import open_db

KEEP_ACKED = 10_000  # acknowledged jobs kept per station (the results table keeps the verdicts)

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


class LineJobs:
    """The `JobStore` of `lineio/station.py` on SQLite (WAL, synchronous=FULL). Thread-safe."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._db = open_db(path)
        self._db.executescript(_SCHEMA)
        self._acks = 0

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def triggered(self, station: str, seq: int, part_id: str, recipe: str) -> None:
        with self._lock:
            self._db.execute("INSERT INTO line_jobs (station, seq, part_id, recipe, triggered) VALUES (?, ?, ?, ?, ?)",
                             (station, seq, part_id, recipe, time.time()))

    def decided(self, station: str, seq: int, result: int, defect_code: int, result_id: str | None) -> None:
        with self._lock:
            self._db.execute("UPDATE line_jobs SET result = ?, defect_code = ?, result_id = ?, decided = ? "
                             "WHERE station = ? AND seq = ? AND result IS NULL",
                             (result, defect_code, result_id, time.time(), station, seq))

    def acked(self, station: str, seq: int) -> None:
        with self._lock:
            self._db.execute("UPDATE line_jobs SET acked = ? WHERE station = ? AND seq = ?",
                             (time.time(), station, seq))
            self._acks += 1
            if self._acks % 500 == 0:
                self._db.execute(
                    "DELETE FROM line_jobs WHERE station = ? AND acked IS NOT NULL AND seq <= "
                    "(SELECT MAX(seq) FROM line_jobs WHERE station = ?) - ?", (station, station, KEEP_ACKED))

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

