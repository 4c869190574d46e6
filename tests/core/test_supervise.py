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


def test_busy_shows_how_long_the_piece_of_work_in_progress_has_run_and_progress_restarts_it() -> None:
    stop, inside, moved_on, done = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    holder: list[SupervisedThread] = []

    def loop() -> None:
        with holder[0].busy():
            inside.set()
            moved_on.wait(10)
            holder[0].progress()  # e.g. a batch answered one of its sequences
            done.wait(10)
        stop.wait()

    thread = SupervisedThread("worker", loop, stop, logging.getLogger("t"))
    holder.append(thread)
    assert thread.busy_s() is None
    thread.start()
    try:
        assert inside.wait(10)
        wait_for(lambda: (thread.busy_s() or 0) >= 0.3, timeout=10, what="busy for 0.3 s")
        moved_on.set()
        wait_for(lambda: (thread.busy_s() or 1) < 0.2, timeout=10, what="progress to restart the count")
        assert thread.status()["busy_s"] < 0.2
        done.set()
        wait_for(lambda: thread.busy_s() is None, timeout=10, what="the work to end")
        assert "busy_s" not in thread.status()
    finally:
        moved_on.set()
        done.set()
        stop.set()
        thread.join(5)
