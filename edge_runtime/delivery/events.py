"""Fan-out of new results to live listeners (the status page's server-sent events).

Every event gets an id, and the hub keeps the last `history` events, so a stream that ends (they end
on purpose after a while, to free their thread) or a page that connects late resumes with
`Last-Event-ID` without a gap.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from typing import Any

Event = tuple[int, dict[str, Any]]
SHUTDOWN: Event = (0, {"type": "shutdown"})


class EventHub:
    """Each subscriber gets a small bounded queue; a slow browser loses old events, never memory."""

    def __init__(self, per_subscriber: int = 32, history: int = 256) -> None:
        self._subs: set[queue.Queue[Event]] = set()
        self._lock = threading.Lock()
        self._size = per_subscriber
        self._history: deque[Event] = deque(maxlen=history)
        self._last_id = 0
        self.closed = False

    @property
    def last_id(self) -> int:
        return self._last_id

    def close(self) -> None:
        """End every open stream (shutdown)."""
        self.closed = True
        with self._lock:
            subs = list(self._subs)
        for q in subs:
            self._put(q, SHUTDOWN)

    def subscribe(self, after: int | None = None) -> tuple[queue.Queue[Event], list[Event]]:
        """A queue of new events, and the kept events after id `after` (none when `after` is None).

        An `after` beyond the newest id comes from before a restart (ids start again at 1): every
        kept event is replayed then.
        """
        q: queue.Queue[Event] = queue.Queue(self._size)
        with self._lock:  # one lock with publish(): no event falls between backlog and queue
            self._subs.add(q)
            if after is None:
                backlog: list[Event] = []
            elif after > self._last_id:
                backlog = list(self._history)
            else:
                backlog = [e for e in self._history if e[0] > after]
        return q, backlog

    def unsubscribe(self, q: queue.Queue[Event]) -> None:
        with self._lock:
            self._subs.discard(q)

    def publish(self, event: dict[str, Any]) -> int:
        with self._lock:
            self._last_id += 1
            item = (self._last_id, event)
            self._history.append(item)
            subs = list(self._subs)
        for q in subs:
            self._put(q, item)
        return item[0]

    @staticmethod
    def _put(q: queue.Queue[Event], item: Event) -> None:
        try:
            q.put_nowait(item)
        except queue.Full:
            try:
                q.get_nowait()  # drop the oldest for this slow subscriber (it can resume by id)
                q.put_nowait(item)
            except (queue.Empty, queue.Full):
                pass

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subs)
