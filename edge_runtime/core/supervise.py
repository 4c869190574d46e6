"""Supervised threads and rate-limited logging: no exception may end a thread the daemon needs.

A `SupervisedThread` runs a loop function; when it raises, the error is logged (at most once a
minute), counted in `restarts`, and the loop starts again after a backoff (0.5 s doubling to 30 s).
Status publishes `{name: {"alive", "restarts"}}` for each, so a restarting thread is visible, and so is
one stuck in a piece of work: a loop marks each piece with `busy()`, and `busy_s` (in its status while
it is on one) is how long the current one has run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class RateLimitedLog:
    """One line per `interval_s` for a repeating condition; the lines in between are counted."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._next = 0.0
        self._suppressed = 0
        self._lock = threading.Lock()

    def log(self, level: int, msg: str, *args: Any, exc_info: bool = False) -> bool:
        """Log now if the interval has passed (returns True), else count it."""
        with self._lock:
            now = time.monotonic()
            if now < self._next:
                self._suppressed += 1
                return False
            suppressed, self._suppressed = self._suppressed, 0
            self._next = now + self.interval_s
        if suppressed:
            msg += f" ({suppressed} more like this in the last {self.interval_s:.0f} s)"
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def reset(self) -> None:
        """The condition ended: the next occurrence is logged at once."""
        with self._lock:
            self._next = 0.0
            self._suppressed = 0


class SupervisedThread:
    """A daemon thread whose loop is restarted with backoff when it raises; returning ends it."""

    def __init__(self, name: str, loop: Callable[[], None], stop: threading.Event,
                 logger: logging.Logger, backoff_max_s: float = 30.0) -> None:
        self.name = name
        self.loop = loop
        self.stop_event = stop
        self.restarts = 0
        self.last_error: str | None = None
        self.backoff_max_s = backoff_max_s
        self._log = RateLimitedLog(logger)
        self._busy_since: float | None = None  # when the piece of work in progress began
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Around one piece of the loop's work (an encode, a search, a batch): a hang inside it shows in
        `busy_s`. Waiting for work is not busy."""
        self._busy_since = time.monotonic()
        try:
            yield
        finally:
            self._busy_since = None

    def progress(self) -> None:
        """The work in progress moved on (a batch answered one of its sequences): `busy_s` counts from now."""
        if self._busy_since is not None:
            self._busy_since = time.monotonic()

    def busy_s(self) -> float | None:
        """How long the piece of work in progress has run; None while the thread waits."""
        since = self._busy_since
        return None if since is None else time.monotonic() - since

    def status(self) -> dict[str, Any]:
        """{"alive", "restarts"}, and "busy_s" while the thread is on a piece of work."""
        busy = self.busy_s()
        out: dict[str, Any] = {"alive": self._thread.is_alive(), "restarts": self.restarts}
        if busy is not None:
            out["busy_s"] = round(busy, 1)
        return out

    def _run(self) -> None:
        delay = 0.5
        while True:
            started = time.monotonic()
            try:
                self.loop()
                return
            except Exception as exc:  # noqa: BLE001 - the point: log, count, restart, never die
                self.restarts += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._log.log(logging.ERROR, "thread %s failed, restarting (restart %d): %s",
                              self.name, self.restarts, self.last_error, exc_info=True)
            if time.monotonic() - started > 60:
                delay = 0.5  # it ran fine for a while: this is a new fault, not a crash loop
            if self.stop_event.wait(delay):
                return
            delay = min(delay * 2, self.backoff_max_s)
