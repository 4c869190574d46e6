"""The journal's file: the one place a connection to it is opened.

Every store that keeps rows beside the results (the journal itself, staged MQTT messages, webhooks,
evidence, reviews) opens its own connection here, so all of them run with the same durability: WAL (so
they share the file, readers never blocking the writer) and `synchronous=FULL` (a committed row survives
a power cut), in autocommit mode with explicit BEGINs, and a 30 s busy timeout.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from edge_runtime.core.errors import StorageFull

# SQLITE_FULL, and SQLITE_IOERR (a WAL or shm write that hit ENOSPC reports as an I/O error).
_FULL_CODES = {13, 10}
_SQLITE_FULL = 13
_NEARLY_FULL = 1 << 20  # an I/O error on opening counts as a full disk below this much free space


def is_full(exc: sqlite3.Error) -> bool:
    """SQLite's way of saying the disk is full (callers staging rows in a journal transaction use it)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _FULL_CODES
    return "full" in str(exc) or "disk I/O" in str(exc)


def open_db(path: Path, schema: str | None = None) -> sqlite3.Connection:
    """A connection of its own to the journal's file, usable from any thread (each owner locks it), with
    `schema` (CREATE ... IF NOT EXISTS) applied. On a full disk (SQLite cannot create its WAL files or
    tables) StorageFull, one line naming the file and the free space: the daemon does not start then,
    and says why instead of an internal error; it starts once space returns (the unit restarts it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        if schema is not None:
            db.executescript(schema)
    except sqlite3.OperationalError as exc:
        db.close()
        free = shutil.disk_usage(path.parent).free
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if not is_full(exc) or (code != _SQLITE_FULL and free >= _NEARLY_FULL):
            raise
        raise StorageFull(f"disk full: the journal {path} cannot be opened ({exc}; {free // 1024} KiB free on "
                          f"{path.parent}): free space on the device") from None
    return db
