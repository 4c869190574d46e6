"""The webhook outbox delivers at least once through receiver outages and restarts, bounded."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.core.sink import Sink
from edge_runtime.delivery.webhooks import RETRYABLE_4XX, WebhookOutbox, origin
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


def test_a_receiver_refusing_the_payload_sets_the_row_aside_not_retried_forever(tmp_path: Path) -> None:
    receiver = Receiver(status=422).start()
    box = outbox(tmp_path / "j.sqlite3")
    try:
        box.put(receiver.url, {"n": 1}, key="a")
        wait_for(lambda: box.status()["failed"] == 1, 10, "the row set aside")
        time.sleep(0.5)  # several backoffs: a set-aside row is not tried again
        s = box.status()
        assert len(receiver.received) == 1 and s["last_error"] == "HTTP 422" and s["pending"] == 0
        dest = origin(receiver.url)
        assert s["blocked"] == [dest] and not box.health().ok  # alerts being thrown away show, by destination
    finally:
        box.close()
        receiver.stop()


def test_a_receiver_refusing_its_credentials_for_a_while_gets_every_row_once_it_accepts(tmp_path: Path) -> None:
    """401 (a rotated token, a wrong `${ENV}` secret) is retried, not set aside: while it lasts the
    destination is blocked, by name, with the status as its last error; once the receiver accepts,
    every row arrives and health heals. Other 4xx that a retry can fix are retried too."""
    assert {401, 403, 404, 407, 408, 409, 421, 423, 425, 429} == RETRYABLE_4XX
    assert not RETRYABLE_4XX & {400, 405, 410, 411, 413, 414, 415, 422}
    receiver = Receiver(status=401).start()
    dest = origin(receiver.url)
    box = outbox(tmp_path / "j.sqlite3")
    try:
        for i in range(5):
            box.put(receiver.url, {"n": i}, key=f"k{i}")
        wait_for(lambda: len(receiver.received) >= 3, 10, "the head row tried again")
        s = box.status()
        assert s["failed"] == 0 and s["pending"] == 5 and s["blocked"] == [dest]
        assert s["destinations"][dest]["last_error"] == "HTTP 401"
        assert receiver.keys() == {"k0"}  # the head row, tried again; the others wait behind it in order
        health = box.health()
        assert not health.ok and health.detail == f"blocked: {dest}"

        receiver.status = 200  # the token is fixed
        wait_for(lambda: box.status()["pending"] == 0, 10, "the held rows delivered")
        s = box.status()
        assert receiver.keys() == {f"k{i}" for i in range(5)} and s["failed"] == 0 and s["blocked"] == []
        assert box.delivered == 5 and box.health().ok and box.health().detail == ""
    finally:
        box.close()
        receiver.stop()


def test_a_receiver_refusing_its_credentials_for_good_keeps_the_outbox_bounded(tmp_path: Path) -> None:
    receiver = Receiver(status=403).start()
    box = WebhookOutbox(tmp_path / "j.sqlite3", max_rows=10, backoff_min_s=0.05, backoff_max_s=0.3)
    try:
        for i in range(25):
            box.put(receiver.url, {"n": i}, key=str(i))
        box.start()
        wait_for(lambda: box.attempts_failed >= 3, 10, "the head row tried again")
        s = box.status()
        assert s["pending"] == 10 and s["failed"] == 0 and box.dropped == 15 and receiver.keys() == {"15"}
        assert s["destinations"][origin(receiver.url)]["last_error"] == "HTTP 403"
        for i in range(25, 30):  # more alerts while it still refuses: the oldest go, the outbox stays at 10
            box.put(receiver.url, {"n": i}, key=str(i))
        s = box.status()
        assert s["pending"] + s["failed"] == 10 and s["failed"] == 0 and box.dropped == 20
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


def test_closing_the_outbox_while_a_destination_backs_off_returns_at_once(tmp_path: Path) -> None:
    """Every sender leaves at close(), also one that reached its wait after another sender cleared the wake-up
    (a close took 5 s, a sender's idle wait, in about one try of two before)."""
    receiver = Receiver(status=403).start()
    try:
        for attempt in range(8):  # the race needs a sender between its pick and its wait: try several times
            box = WebhookOutbox(tmp_path / f"j{attempt}.sqlite3", max_rows=10, backoff_min_s=0.05, backoff_max_s=0.3)
            for i in range(25):
                box.put(receiver.url, {"n": i}, key=str(i))
            box.start()
            wait_for(lambda: box.attempts_failed >= 3, 10, "the head row tried again")  # noqa: B023 (waited here)
            for i in range(25, 30):
                box.put(receiver.url, {"n": i}, key=str(i))
            t0 = time.monotonic()
            box.close()
            took = time.monotonic() - t0
            assert took < 1.0, f"close() took {took:.2f} s (try {attempt})"
            assert not any(t.is_alive() for t in box._threads)
    finally:
        receiver.stop()


def test_a_refused_row_whose_rule_is_gone_or_moved_is_set_aside_and_no_longer_holds_back_its_destination(
        tmp_path: Path) -> None:
    """A retryable 4xx waits for a fix only while the running config still posts the row's source to its URL:
    a row of a removed rule (sent without its headers) or of a mistyped URL since corrected would be refused
    for ever and hold back every later row of its destination, so it is set aside."""
    receiver = Receiver(status=401).start()
    wanted = {"old": True}
    box = WebhookOutbox(tmp_path / "j.sqlite3", backoff_min_s=0.05, backoff_max_s=0.3,
                        current=lambda source, url: source != "old" or wanted["old"])
    box.start()
    try:
        box.put(receiver.url, {"n": 0}, key="old-0", source="old")
        wait_for(lambda: box.attempts_failed >= 2, 10, "the old row tried again")
        assert box.status()["failed"] == 0  # its rule still posts there: it waits for the fix
        box.put(receiver.url, {"n": 1}, key="new-1", source="new")
        wanted["old"] = False  # the config's reload removed the old rule
        wait_for(lambda: box.status()["failed"] == 1, 10, "the old row set aside")
        receiver.status = 200
        wait_for(lambda: box.status()["pending"] == 0, 10, "the new row delivered")
        assert "new-1" in receiver.keys() and box.status()["failed"] == 1
    finally:
        box.close()
        receiver.stop()


def test_a_rule_refused_on_its_path_holds_back_its_own_rows_not_another_rules_to_the_same_host(
        tmp_path: Path) -> None:
    receiver = Receiver().start()
    receiver.path_status["/wrong"] = 404  # rule a's path is mistyped; rule b posts to the right one
    wrong = receiver.url.replace("/hook", "/wrong")
    box = outbox(tmp_path / "j.sqlite3")
    try:
        box.put(wrong, {"n": 0}, key="a0", source="a:0")
        box.put(wrong, {"n": 1}, key="a1", source="a:0")
        box.put(receiver.url, {"n": 2}, key="b2", source="b:0")
        box.put(receiver.url, {"n": 3}, key="b3", source="b:0")
        wait_for(lambda: box.delivered == 2, 10, "rule b's rows delivered past rule a's refused ones")
        wait_for(lambda: box.attempts_failed >= 3, 10, "rule a's head row tried again")
        s = box.status()
        assert s["pending"] == 2 and s["failed"] == 0  # rule a's rows wait for the path to be fixed
        assert [k for k, _ in receiver.received if k.startswith("b")] == ["b2", "b3"]  # each line in order
        assert {k for k, _ in receiver.received if k.startswith("a")} == {"a0"}  # a1 waits behind a0
    finally:
        box.close()
        receiver.stop()


def test_a_row_whose_rule_is_gone_is_set_aside_at_its_first_failure_of_any_kind(tmp_path: Path) -> None:
    receiver = Receiver()  # never started: the connection is refused
    box = WebhookOutbox(tmp_path / "j.sqlite3", backoff_min_s=0.05, backoff_max_s=0.3,
                        current=lambda source, _url: source != "gone:0")
    box.start()
    try:
        box.put(receiver.url, {"n": 0}, key="g", source="gone:0")
        box.put(receiver.url, {"n": 1}, key="k", source="kept:0")
        wait_for(lambda: box.status()["failed"] == 1, 10, "the gone rule's row set aside")
        wait_for(lambda: box.attempts_failed >= 3, 10, "the kept rule's row tried again")
        s = box.status()
        assert s["failed"] == 1 and s["pending"] == 1  # the kept rule's row waits for its receiver
    finally:
        box.close()
