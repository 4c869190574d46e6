"""The MQTT messages the verdict stage queues (alerts, reviews): the interface it stages them through
and their bound. `delivery/mqtt/outbox.py:MessageOutbox` implements it in the journal's file, so a
message is durable exactly when its result is."""

from __future__ import annotations

import sqlite3
from typing import Protocol

MAX_PAYLOAD = 256 * 1024  # an alert is a few hundred bytes; refuse anything that would bloat the file


class MessageQueue(Protocol):
    """Messages staged on the caller's transaction, a wake-up after its commit."""

    max_rows: int
    dropped_unsent: int  # undelivered messages given up to stay within max_rows

    def stage(self, db: sqlite3.Connection, topic: str, payload: str) -> int: ...  # ValueError over MAX_PAYLOAD

    def notify(self) -> None: ...

    def backlog(self) -> int: ...

    def close(self) -> None: ...
