"""The journal's file: the one place a connection to it is opened.

Every store that keeps rows beside the results (the journal itself, staged MQTT messages, webhooks,
evidence, reviews) opens its own connection here, so all of them run with the same durability: WAL (so
they share the file, readers never blocking the writer) and `synchronous=FULL` (a committed row survives
a power cut), in autocommit mode with explicit BEGINs, and a 30 s busy timeout.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path


def open_db(path: Path) -> sqlite3.Connection:
    """A connection of its own to the journal's file, usable from any thread (each owner locks it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db
