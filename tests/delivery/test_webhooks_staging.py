"""Results staging webhooks in overlapping journal transactions each get their own wake-up and count."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.delivery.webhooks import MAX_STAGING, WebhookOutbox
from tests.support.receiver import Receiver
from tests.support.waiting import wait_for


def result() -> Result:
    return Result(device="d", camera="cam", frame=FrameInfo(0, 1, 1), verdict={}, text="", model="m",
                  timings_ms={"total": 1.0}, prompt="p")


def test_a_result_staged_before_another_results_failed_transaction_is_still_delivered_at_once(
        tmp_path: Path) -> None:
    """A commits its POST; B stages one before A's wake-up runs and its transaction rolls back (its
    journal write failed). A's wake-up must not be lost: its POST goes out at once, not on the next
    5 s poll of the idle senders."""
    receiver = Receiver().start()
    path = tmp_path / "j.sqlite3"
    box = WebhookOutbox(path, backoff_min_s=0.05, backoff_max_s=0.3)
    db = sqlite3.connect(str(path), isolation_level=None)
    box.start()
    try:
        time.sleep(0.5)  # the idle senders are asleep on their 5 s poll
        a, b = result(), result()
        db.execute("BEGIN")
        box.stage(db, receiver.url, {"r": "a"}, key=f"{a.id}:0", result_id=a.id)
        db.execute("COMMIT")
        db.execute("BEGIN")
        box.stage(db, receiver.url, {"r": "b"}, key=f"{b.id}:0", result_id=b.id)
        db.execute("ROLLBACK")
        t0 = time.monotonic()
        box.notify(a)
        wait_for(lambda: f"{a.id}:0" in receiver.keys(), 2.0, "A's POST without waiting for the poll")
        assert time.monotonic() - t0 < 2.0 and receiver.keys() == {f"{a.id}:0"}
        box.notify(b)  # rolled back: nothing to send, and no error
        assert box.status()["pending"] == 0
    finally:
        db.close()
        box.close()
        receiver.stop()


def test_two_results_committed_before_their_wake_ups_both_count_what_the_bound_dropped(tmp_path: Path) -> None:
    """A and B both commit before either wake-up runs: each notify counts its own result's drops."""
    path = tmp_path / "j.sqlite3"
    box = WebhookOutbox(path, max_rows=1)  # not started: nothing is delivered
    db = sqlite3.connect(str(path), isolation_level=None)
    try:
        box.put("http://127.0.0.1:9/x", {"n": 0}, key="old")
        a, b = result(), result()
        for r in (a, b):  # each staged row pushes the one before it out of a bound of one
            db.execute("BEGIN")
            box.stage(db, "http://127.0.0.1:9/x", {"r": r.id}, key=f"{r.id}:0", result_id=r.id)
            db.execute("COMMIT")
        box._wake.clear()
        box.notify(a)
        assert box._wake.is_set() and box.dropped == 1
        box._wake.clear()
        box.notify(b)
        assert box._wake.is_set() and box.dropped == 2
        box.notify(a)  # told twice: counted once
        assert box.dropped == 2
    finally:
        db.close()
        box.close()


def test_results_staged_whose_transactions_never_committed_are_forgotten_past_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    box = WebhookOutbox(path)  # not started
    db = sqlite3.connect(str(path), isolation_level=None)
    try:
        results = [result() for _ in range(MAX_STAGING + 10)]
        for r in results:  # every journal write fails: no notify ever comes
            db.execute("BEGIN")
            box.stage(db, "http://127.0.0.1:9/x", {}, key=r.id, result_id=r.id)
            db.execute("ROLLBACK")
        assert len(box._staging) == MAX_STAGING and results[0].id not in box._staging
        assert results[-1].id in box._staging
    finally:
        db.close()
        box.close()
