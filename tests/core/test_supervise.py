"""Supervised threads restart a loop that raised, count it, and log it once a minute, not per failure."""

from __future__ import annotations

import logging
import threading

import pytest

from edge_runtime.core.supervise import RateLimitedLog, SupervisedThread
from tests.support.waiting import wait_for


def test_a_loop_that_raises_is_restarted_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    runs: list[int] = []

    def loop() -> None:
        runs.append(1)
        if len(runs) <= 3:
            raise OSError("database or disk is full")
        stop.wait()

    thread = SupervisedThread("worker", loop, stop, logging.getLogger("t"), backoff_max_s=0.05)
    thread.start()
    try:
        wait_for(lambda: len(runs) == 4, timeout=10, what="fourth run")
        assert thread.status() == {"alive": True, "restarts": 3}
        assert thread.last_error == "OSError: database or disk is full"
        assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()


def test_rate_limited_log_counts_what_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    limited = RateLimitedLog(logging.getLogger("t"), interval_s=3600)
    caplog.set_level(logging.INFO)
    assert [limited.log(logging.ERROR, "disk full") for _ in range(10)] == [True] + [False] * 9
    limited.reset()
    assert limited.log(logging.ERROR, "disk full again")
    assert [r.getMessage() for r in caplog.records] == ["disk full", "disk full again"]
