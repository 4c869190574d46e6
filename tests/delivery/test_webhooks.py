"""The webhook outbox delivers at least once through receiver outages and restarts, bounded."""

from __future__ import annotations

from pathlib import Path

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
