"""The webhook outbox delivers at least once through receiver outages and restarts, bounded."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.core.sink import Sink
from edge_runtime.delivery.webhooks import WebhookOutbox
from tests.support.receiver import Receiver
from tests.support.waiting import wait_for


def outbox(path: Path) -> WebhookOutbox:
    box = WebhookOutbox(path, backoff_min_s=0.05, backoff_max_s=0.3)
    box.start()
    return box


def test_a_receiver_outage_and_a_daemon_restart_lose_no_webhook(tmp_path: Path) -> None:
    receiver = Receiver().start()
    db = tmp_path / "j.sqlite3"
    box = outbox(db)
    try:
        for i in range(20):
            box.put(receiver.url, {"n": i}, key=f"k{i}")
        wait_for(lambda: len(receiver.keys()) >= 5, 10, "first deliveries")
        receiver.stop()  # the receiver goes down mid-run
        for i in range(20, 40):
            box.put(receiver.url, {"n": i}, key=f"k{i}")
        wait_for(lambda: box.attempts_failed > 0, 10, "a failed attempt")
        box.close()  # the daemon restarts while the receiver is still down
        box = outbox(db)
        assert box.status()["pending"] == 40 - len(receiver.keys())
        receiver.start()
        wait_for(lambda: box.status()["pending"] == 0, 20, "the backlog to drain")
        assert receiver.keys() == {f"k{i}" for i in range(40)}
        assert {body["n"] for _, body in receiver.received} == set(range(40))
    finally:
        box.close()
        receiver.stop()


def test_a_refusing_receiver_is_set_aside_not_retried_forever(tmp_path: Path) -> None:
    receiver = Receiver(status=404).start()
    box = outbox(tmp_path / "j.sqlite3")
    try:
        box.put(receiver.url, {"n": 1}, key="a")
        wait_for(lambda: box.status()["failed"] == 1, 10, "the row set aside")
        assert len(receiver.received) == 1 and box.status()["last_error"] == "HTTP 404"
    finally:
        box.close()
        receiver.stop()


def test_the_outbox_is_bounded(tmp_path: Path) -> None:
    box = WebhookOutbox(tmp_path / "j.sqlite3", max_rows=10)  # not started: nothing is delivered
    for i in range(25):
        box.put("http://127.0.0.1:9/x", {"n": i}, key=str(i))
    assert box.status()["pending"] == 10 and box.dropped == 15
    box.close()


def test_as_a_sink_the_outbox_wakes_only_for_the_committed_result_that_staged_rows(tmp_path: Path) -> None:
    """The verdict stage stages POSTs in the result's transaction; `notify(result)` after its commit
    counts what the bound dropped for them and wakes the senders; another result's notify does neither."""
    def result() -> Result:
        return Result(device="d", camera="cam", frame=FrameInfo(0, 1, 1), verdict={}, text="", model="m",
                      timings_ms={"total": 1.0}, prompt="p")

    box = WebhookOutbox(tmp_path / "j.sqlite3", max_rows=2)  # not started: nothing is delivered
    assert isinstance(box, Sink) and box.name == "webhooks"
    db = sqlite3.connect(str(tmp_path / "j.sqlite3"), isolation_level=None)
    try:
        staged, other = result(), result()
        db.execute("BEGIN")
        for i in range(3):  # three rows over a bound of two: one dropped
            box.stage(db, "http://127.0.0.1:9/x", {"n": i}, key=f"{staged.id}:{i}", result_id=staged.id)
        db.execute("COMMIT")
        box.notify(other)
        assert not box._wake.is_set() and box.dropped == 0
        box.notify(staged)
        assert box._wake.is_set() and box.dropped == 1
        box._wake.clear()
        box.notify(staged)  # told twice: counted once
        assert not box._wake.is_set() and box.dropped == 1
        assert box.health().ok and box.health().detail == ""
    finally:
        db.close()
        box.close()
