"""A receiver that drips (a byte every second) or answers junk never delays another destination."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from pathlib import Path

from edge_runtime.api.metrics import webhook_metrics
from edge_runtime.delivery.webhooks import WebhookOutbox, clean_error, origin
from tests.support.receiver import Receiver
from tests.support.waiting import wait_for


class RawReceiver:
    """Accepts, reads the request, then sends `answer` one chunk every `every_s` (a drip), or at once."""

    def __init__(self, answer: bytes = b"HTTP/1.1 200 OK\r\n", every_s: float = 1.0, chunk: int = 1) -> None:
        self.answer, self.every_s, self.chunk = answer, every_s, chunk
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.accepted = 0
        self._stop = threading.Event()
        self._acceptor = threading.Thread(target=self._serve, name="raw-receiver-accept", daemon=True)
        self._acceptor.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            for i in range(0, len(self.answer), self.chunk):
                conn.sendall(self.answer[i:i + self.chunk])
                if self._stop.wait(self.every_s):
                    break
        except OSError:
            pass
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept(): closing alone does not on Linux
        except OSError:
            pass
        self.sock.close()
        self._acceptor.join(5)


def _rate(box: WebhookOutbox, healthy: Receiver, n: int) -> float:
    t0 = time.monotonic()
    for i in range(n):
        box.put(healthy.url, {"n": i}, key=f"h{i}-{t0}")
    wait_for(lambda: len(healthy.received) >= n, 30, "the healthy receiver's deliveries")
    return n / (time.monotonic() - t0)


def test_a_dripping_receiver_does_not_delay_a_healthy_one(tmp_path: Path) -> None:
    healthy = Receiver().start()
    base = WebhookOutbox(tmp_path / "base.sqlite3")
    base.start()
    drip = RawReceiver(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" * 20, every_s=1.0)
    box = WebhookOutbox(tmp_path / "j.sqlite3", backoff_min_s=0.2, backoff_max_s=1.0)
    box.start()
    try:
        alone = _rate(base, healthy, 100)
        healthy.received.clear()
        # The dripping rows go in first: an outbox that sent in one queue would be stuck on them.
        for i in range(20):
            box.put(drip.url, {"n": i}, key=f"d{i}", timeout_s=6.0)
        wait_for(lambda: drip.accepted >= 1, 5, "the dripping receiver to be in flight")
        beside = _rate(box, healthy, 100)
        # Every healthy row was delivered while the drip's first attempt was still hanging (not a rate
        # against a threshold, which a loaded 2-core CI machine can miss by chance).
        d = box.status()["destinations"][origin(drip.url)]
        print(f"\nhealthy receiver: {alone:.0f} deliveries/s alone, {beside:.0f}/s beside a dripping one "
              f"(ratio {beside / alone:.2f})")
        assert drip.accepted == 1 and d["timeouts"] == 0 and d["attempts_failed"] == 0
        # the dripping destination is blocked, timed out, counted and visible
        wait_for(lambda: box.status()["destinations"][origin(drip.url)]["timeouts"] >= 1, 10, "a timeout")
        s = box.status()
        d = s["destinations"][origin(drip.url)]
        assert d["pending"] == 20 and d["last_error"].startswith("timeout") and d["attempts_failed"] >= 1
        assert s["attempts_failed"] >= 1 and origin(drip.url) in s["blocked"]
        assert s["destinations"][origin(healthy.url)]["pending"] == 0
        text = "\n".join(f"{m.name} {sample.labels} {sample.value}" for m in webhook_metrics(s)
                         for sample in m.samples)
        assert f"'destination': '{origin(drip.url)}'" in text and "edge_webhook_destination_timeouts" in text
        json.dumps(s)
    finally:
        box.close()
        base.close()
        drip.stop()
        healthy.stop()


def test_a_row_in_flight_at_a_crash_is_not_tried_first_after_restart(tmp_path: Path) -> None:
    healthy = Receiver().start()
    drip = RawReceiver(b"HTTP/1.1 200 OK\r\n", every_s=5.0)
    db = tmp_path / "j.sqlite3"
    box = WebhookOutbox(db, senders=1)
    box.start()
    try:
        box.put(drip.url, {"n": 0}, key="d0", timeout_s=30.0)
        wait_for(lambda: drip.accepted >= 1, 5, "the POST in flight")
        box._stop.set()  # the daemon dies mid-POST: the row stays, its lease is persisted
        box._wake.set()
        for i in range(5):
            box.put(healthy.url, {"n": i}, key=f"h{i}")
        box = WebhookOutbox(db, senders=1)  # one sender: it must take the healthy rows first
        box.start()
        wait_for(lambda: len(healthy.received) == 5, 5, "the healthy rows after the restart")
        assert drip.accepted == 1
    finally:
        box.close()
        drip.stop()
        healthy.stop()


def test_huge_and_junk_answers_are_bounded_and_their_text_is_clean(tmp_path: Path) -> None:
    huge = RawReceiver(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n" + b"x" * 4_000_000,
                       every_s=0.0, chunk=65536)
    junk = RawReceiver(b"HTTP/1.1 5\xed\xa0\x80 \xff\x00junk\r\n\r\n", every_s=0.0, chunk=1000)
    box = WebhookOutbox(tmp_path / "j.sqlite3", backoff_min_s=30)
    box.start()
    try:
        t0 = time.monotonic()
        box.put(huge.url, {"n": 0}, key="h")
        box.put(junk.url, {"n": 0}, key="j")
        wait_for(lambda: box.delivered == 1 and box.attempts_failed == 1, 5, "both answered")
        assert time.monotonic() - t0 < 5
        err = box.status()["destinations"][origin(junk.url)]["last_error"]
        json.dumps(box.status(), ensure_ascii=False).encode("utf-8")  # no lone surrogate, no control chars
        assert err and all(c.isprintable() for c in err)
    finally:
        box.close()
        huge.stop()
        junk.stop()
    assert clean_error("bad \ud800 text\n" + "x" * 1000).encode("utf-8")[:9] == b"bad ? tex"
    assert len(clean_error("x" * 1000)) == 200


def test_an_existing_database_keeps_working(tmp_path: Path) -> None:
    db = tmp_path / "old.sqlite3"
    old = sqlite3.connect(db)
    old.executescript("CREATE TABLE webhook_outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, url TEXT NOT NULL, "
                      "source TEXT NOT NULL, body TEXT NOT NULL, key TEXT NOT NULL, timeout_s REAL NOT NULL, "
                      "created REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, next_try REAL NOT NULL, "
                      "failed INTEGER NOT NULL DEFAULT 0, last_error TEXT);")
    healthy = Receiver().start()
    old.execute("INSERT INTO webhook_outbox (url, source, body, key, timeout_s, created, next_try) "
                "VALUES (?, '', '{}', 'old', 5, 0, 0)", (healthy.url,))
    old.commit()
    old.close()
    box = WebhookOutbox(db)
    box.start()
    try:
        wait_for(lambda: healthy.keys() == {"old"}, 5, "the old row delivered")
    finally:
        box.close()
        healthy.stop()
