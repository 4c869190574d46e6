"""Who hears of a station's changes: its signal watchers, told one delivery at a time and in order."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from edge_runtime.core.supervise import RateLimitedLog
from edge_runtime.lineio.signals import Signals


class Watchers:
    """The watchers of one station's `Signals`; `changed` delivers the snapshot `signals` makes."""

    def __init__(self, name: str, signals: Callable[[], Signals], counters: dict[str, int],
                 bad_log: RateLimitedLog) -> None:
        self.name = name
        self._signals, self._counters, self._bad_log = signals, counters, bad_log
        self._notify_lock = threading.RLock()  # a watcher may trigger (GPIO): re-entry is fine
        self._dirty = False  # a change not yet delivered to the watchers (see changed)
        self._watch_lock = threading.Lock()  # subscribing; the list is replaced, never changed in place
        self._watchers: list[Callable[[Signals], None]] = []
        self._last_sent: Signals | None = None

    def watch(self, callback: Callable[[Signals], None]) -> Callable[[], None]:
        """Call `callback(signals)` on every change; returns the unsubscribe function."""
        with self._watch_lock:  # not the delivery's lock: only a delivery may hold that (see changed)
            self._watchers = [*self._watchers, callback]

        def unsubscribe() -> None:
            with self._watch_lock:
                if callback in self._watchers:
                    rest = list(self._watchers)
                    rest.remove(callback)
                    self._watchers = rest
        return unsubscribe

    def changed(self) -> None:
        """Tell the watchers, one delivery at a time and in order. A thread that finds another
        delivering leaves the change to it (the deliverer looks again before it lets go) instead of
        waiting: a watcher that acks or triggers waits for the job store's writer, and the writer,
        showing that very write, must never wait for the watcher's delivery in turn."""
        self._dirty = True
        while self._dirty:
            if not self._notify_lock.acquire(blocking=False):
                return  # the thread delivering now sees `_dirty` and delivers this change too
            try:
                while self._dirty:
                    self._dirty = False
                    self._deliver()
            finally:
                self._notify_lock.release()

    def _deliver(self) -> None:
        snap = self._signals()
        if snap == self._last_sent:
            return
        self._last_sent = snap
        for callback in self._watchers:  # a snapshot: (un)subscribing replaces the list
            try:
                callback(snap)
            except Exception:  # noqa: BLE001 - one failing watcher never stops the others
                self._counters["watcher_errors"] += 1
                self._bad_log.log(logging.ERROR, "station %s: a signal watcher failed", self.name,
                                  exc_info=True)
