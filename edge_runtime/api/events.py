"""Fan-out of new results to live listeners (the status page's server-sent events)."""

from __future__ import annotations

import queue
import threading
from typing import Any


class EventHub:
    """Each subscriber gets a small bounded queue; a slow browser loses old events, never memory."""

    def __init__(self, per_subscriber: int = 32) -> None:
        self._subs: set[queue.Queue[dict[str, Any]]] = set()
        self._lock = threading.Lock()
        self._size = per_subscriber
        self.closed = False

    def close(self) -> None:
        """End every open stream (shutdown)."""
        self.closed = True
        self.publish({"type": "shutdown"})

    def subscribe(self) -> queue.Queue[dict[str, Any]]:
        q: queue.Queue[dict[str, Any]] = queue.Queue(self._size)
        with self._lock:
            self._subs.add(q)
        return q

    def unsubscribe(self, q: queue.Queue[dict[str, Any]]) -> None:
        with self._lock:
            self._subs.discard(q)

    def publish(self, event: dict[str, Any]) -> None:
        with self._lock:
            subs = list(self._subs)
        for q in subs:
            try:
                q.put_nowait(event)
            except queue.Full:
                try:
                    q.get_nowait()  # drop the oldest for this slow subscriber
                    q.put_nowait(event)
                except (queue.Empty, queue.Full):
                    pass

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subs)
