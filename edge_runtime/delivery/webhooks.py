"""An at-least-once webhook outbox: POSTs queued in SQLite, delivered per destination with backoff.

A row leaves the table only after the receiver answered 2xx, so a receiver outage or a daemon restart
loses nothing (each POST carries an `Idempotency-Key` for de-duplication). Request headers (often a
secret) are not stored: `headers_for(source)` reads them from the running config at send time. The
table is bounded: beyond `max_rows` the oldest rows are dropped and counted. A 4xx that refuses the
payload itself (400, 410, 413, 422, ...: every 4xx not in `RETRYABLE_4XX`) is permanent: the row is set
aside (kept, counted, visible in status) instead of retried. The 4xx in `RETRYABLE_4XX` (an expired
token, a route not there yet, a lock, a rate limit) are retried like a 5xx.

Delivery is per destination (URL origin: scheme, host, port): a small fixed pool of sender threads,
at most one POST in flight per destination. A destination's rows wait in lines, one per rule action and
URL, each line in order and in its own backoff (its head row's `next_try`, persisted): a line whose head
is refused holds back its own rows, not another rule's to the same host. Every POST goes through `core/http.py`, one
overall deadline over name lookup, connect, TLS, send, headers and body, so a receiver that drips a
byte every few seconds costs one sender for `timeout_s`, never the other destinations.
Before a POST its row's `next_try` is pushed past the deadline, so after a crash mid-POST the row is
not tried first, ahead of other destinations' due rows.

The outbox is the daemon's webhook `Sink` (core/sink.py): the verdict stage stages a fired rule's
POSTs in the journal's transaction of the result (`stage(..., result_id=)`: the outbox pattern, as
MQTT's alerts), and `notify(result)`, called once that transaction committed, counts what the bound
dropped for it and wakes the senders. `health()` names the destinations that are blocked.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from edge_runtime.core import http
from edge_runtime.core.result import Result
from edge_runtime.core.sink import SinkHealth
from edge_runtime.verdicts.database import open_db

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS webhook_outbox (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    url        TEXT NOT NULL,
    source     TEXT NOT NULL,              -- what queued it (rule:action); its headers come from the config
    body       TEXT NOT NULL,
    key        TEXT NOT NULL,
    timeout_s  REAL NOT NULL,
    created    REAL NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    next_try   REAL NOT NULL,
    failed     INTEGER NOT NULL DEFAULT 0,   -- 1: refused for good (a 4xx), kept for inspection
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS webhook_outbox_due ON webhook_outbox (failed, next_try);
CREATE INDEX IF NOT EXISTS webhook_outbox_url ON webhook_outbox (failed, url, seq);
"""
MAX_BODY = 256 * 1024
MAX_RESPONSE = 1024          # bytes of a response body read (the rest is not waited for)
MAX_ERROR = 200              # characters of an error kept in status
MAX_DESTINATIONS = 256       # destinations reported in status (most pending first)
SENDERS = 4                  # sender threads: at most this many destinations in flight at once
MAX_STAGING = 256            # results staged and not yet notified that are remembered (one is the norm)
# 4xx answers retried with backoff like a 5xx or a timeout, not set aside: they say the receiver (its
# credentials, route, state or load) refuses now, not that this payload will always be refused. 401/403:
# a rotated token or a wrong `${ENV}` secret in `headers` (read from the running config at each POST, so
# fixing it delivers the held rows); 404: a receiver whose route is missing for a while (mid-deploy); 407:
# a proxy's credentials; 408: a request timeout; 409/423/425: conflict, locked, too early (a retry fixes
# them); 421: sent to a server that does not serve this origin (a load balancer's routing); 429: rate
# limited. Every other 4xx (400, 405, 410, 411, 413, 414, 415, 422, ...) refuses the request itself and
# would refuse it again: the row is set aside. A destination answering one of these stays blocked (health
# degraded by name, its last error naming the status) until a delivery there succeeds, and its rows stay
# within `max_rows`. A row whose rule action left the running config, or now posts elsewhere (`current`),
# is set aside at its first failure of any kind.
RETRYABLE_4XX = frozenset({401, 403, 404, 407, 408, 409, 421, 423, 425, 429})


def origin(url: str) -> str:
    """scheme://host:port of a URL (the unit of ordering, concurrency and backoff)."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.scheme}://{parts.hostname or ''}:{port}"
    except ValueError:
        return url[:100]


def clean_error(text: str) -> str:
    """An error text safe to keep, log and serve as JSON: valid UTF-8, no control characters, bounded."""
    text = text.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate becomes '?'
    text = "".join(c if c.isprintable() else " " for c in text)
    return text if len(text) <= MAX_ERROR else text[:MAX_ERROR - 1] + "…"


@dataclass
class _Dest:
    in_flight_since: float | None = None  # wall clock
    last_error: str | None = None
    consecutive_failures: int = 0
    delivered: int = 0
    attempts_failed: int = 0
    timeouts: int = 0


class WebhookOutbox:
    """Queue with `put` (or `stage` in a caller's transaction), deliver from background threads; a `Sink`."""

    name = "webhooks"

    def __init__(self, db_path: Path, max_rows: int = 10_000, backoff_min_s: float = 1.0,
                 backoff_max_s: float = 300.0, senders: int = SENDERS,
                 headers_for: Callable[[str], dict[str, str]] | None = None,
                 current: Callable[[str, str], bool] | None = None) -> None:
        """`headers_for(source)`: a row's request headers, read at send time (secrets are not stored).
        `current(source, url)`: whether the running config still sends that row's source to that URL; a row
        whose source is gone or moved is set aside on any 4xx (None: every row is current)."""
        self.max_rows = max_rows
        self._drop_logged_at = -60.0
        self.backoff_min_s, self.backoff_max_s = backoff_min_s, backoff_max_s
        self.senders = max(1, senders)
        self._lock = threading.Lock()
        self._db = open_db(db_path, _SCHEMA)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.headers_for = headers_for or (lambda _source: {})
        self.current = current or (lambda _source, _url: True)
        self.delivered = 0
        self.dropped = 0
        self.attempts_failed = 0
        self.last_error: str | None = None
        self._dests: dict[str, _Dest] = {}
        self._busy: set[str] = set()  # destinations with a POST in flight
        self._rr = 0  # round-robin cursor over destinations
        self._logged: dict[str, tuple[str | None, float]] = {}
        # result id -> (rows staged, oldest rows dropped), applied by `notify(result)` once its transaction
        # committed. One entry per result, so a result staged while another's wake-up has not run yet
        # (or whose transaction rolls back) never takes that wake-up or count away. Bounded: the entry of
        # a transaction that never committed (its notify never comes) is forgotten after MAX_STAGING.
        self._staging: dict[str, tuple[int, int]] = {}
        self._staging_lock = threading.Lock()

    def put(self, url: str, body: dict[str, Any], key: str, source: str = "", timeout_s: float = 5.0) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN")
            over = self.stage(self._db, url, body, key, source, timeout_s)
        self.queued(over)

    def stage(self, db: sqlite3.Connection, url: str, body: dict[str, Any], key: str, source: str = "",
              timeout_s: float = 5.0, *, result_id: str | None = None) -> int:
        """Insert one delivery on `db` (the caller's transaction, e.g. the journal's); returns how many
        of the oldest rows were dropped to stay bounded. After the commit: `notify(result)` for the
        result `result_id` names (the verdict stage's rows), else the caller's `queued(dropped)`.
        Raises ValueError for an oversized body before touching the database."""
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        if len(text) > MAX_BODY:
            raise ValueError(f"webhook body is larger than {MAX_BODY} bytes")
        now = time.time()
        db.execute("INSERT INTO webhook_outbox (url, source, body, key, timeout_s, created, next_try) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?)", (url, source, text, key, timeout_s, now, now))
        dropped = int(db.execute("DELETE FROM webhook_outbox WHERE seq <= (SELECT seq FROM webhook_outbox "
                                 "ORDER BY seq DESC LIMIT 1 OFFSET ?)", (self.max_rows,)).rowcount)
        if result_id is not None:
            with self._staging_lock:
                rows, over = self._staging.pop(result_id, (0, 0))  # re-inserted: the newest entry
                self._staging[result_id] = (rows + 1, over + dropped)
                while len(self._staging) > MAX_STAGING:
                    del self._staging[next(iter(self._staging))]  # the oldest: never committed
        return dropped

    def queued(self, dropped: int = 0) -> None:
        """After a commit that staged deliveries: count what the bound dropped and wake the senders."""
        if dropped > 0:
            self.dropped += dropped
            now = time.monotonic()
            if now >= self._drop_logged_at + 60:  # a receiver down for hours: one line a minute, not one a verdict
                log.warning("webhooks: outbox full (%d rows); %d oldest deliveries dropped so far",
                            self.max_rows, self.dropped)
                self._drop_logged_at = now
        self._wake.set()

    # ---- the Sink (core/sink.py) ----------------------------------------------------------------------

    def notify(self, result: Result) -> None:
        """`result` is committed: so are the POSTs staged with its id. Count what the bound dropped for
        them and wake the senders; never blocks (no query, no network)."""
        with self._staging_lock:
            staged = self._staging.pop(result.id, None)
        if staged is None:
            return  # no rule with a webhook fired on it (or told twice)
        self.queued(staged[1])

    def health(self) -> SinkHealth:
        """Not ok while a destination keeps failing or a POST hangs (`blocked`); cheap (no query)."""
        blocked = self.blocked()
        detail = f"blocked: {', '.join(blocked[:3])}{' …' if len(blocked) > 3 else ''}" if blocked else ""
        return SinkHealth(not blocked, detail, {"delivered": self.delivered, "dropped": self.dropped,
                                                "attempts_failed": self.attempts_failed})

    # ---- delivery ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._threads = [threading.Thread(target=self._run, name=f"webhooks-{i}", daemon=True)
                         for i in range(self.senders)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop the senders (tolerates a never-started outbox); the rows stay for the next start."""
        self._stop.set()
        deadline = time.monotonic() + 10  # in all; a POST in flight ends by its own deadline, its row stays
        for t in self._threads:
            while t.is_alive() and time.monotonic() < deadline:
                # Set again and again: a sender woken by it clears it, and one that passed its stop check
                # before stop() would then sleep its whole idle wait (5 s) in a close.
                self._wake.set()
                t.join(0.05)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                job, sleep_s = self._pick()
                if job is None:
                    self._wake.wait(sleep_s)
                    if not self._stop.is_set():  # stopping: leave it set for the other senders
                        self._wake.clear()
                    continue
                try:
                    self._attempt(*job)
                finally:
                    with self._lock:
                        self._busy.discard(origin(job[1]))
            except Exception:  # a bug here must not end delivery for good
                log.exception("webhooks: delivery loop error")
                self._stop.wait(1.0)

    def _pick(self) -> tuple[tuple[int, str, str, str, str, float, int] | None, float]:
        """The oldest due head row of the next destination not in flight, round-robin; else how long to sleep.
        A destination's rows wait in lines, one per rule action and URL, each in order: a line whose head
        is refused (a wrong path, a wrong secret) holds back its own rows, not another rule's."""
        now = time.time()
        with self._lock:
            heads: dict[str, list[int]] = {}  # destination -> the head row of each of its lines
            for url, seq in self._db.execute(
                    "SELECT url, MIN(seq) FROM webhook_outbox WHERE failed = 0 GROUP BY url, source"):
                heads.setdefault(origin(url), []).append(seq)
            order = sorted(heads)
            sleep_s = 5.0
            for i in range(len(order)):
                o = order[(self._rr + i) % len(order)]
                if o in self._busy:
                    continue
                row = None
                for seq in sorted(heads[o]):  # oldest first: lines of one destination keep step when all are due
                    head = self._db.execute("SELECT seq, url, source, body, key, timeout_s, attempts, next_try "
                                            "FROM webhook_outbox WHERE seq = ?", (seq,)).fetchone()
                    if head[7] <= now:
                        row = head
                        break
                    sleep_s = min(sleep_s, head[7] - now)
                if row is None:
                    continue
                self._rr = (self._rr + i + 1) % max(1, len(order))
                self._busy.add(o)
                self._dests.setdefault(o, _Dest()).in_flight_since = now
                # persisted lease: a crash mid-POST leaves this row behind the other destinations' due rows
                self._db.execute("UPDATE webhook_outbox SET next_try = ? WHERE seq = ?",
                                 (now + row[5] + self.backoff_min_s, row[0]))
                return tuple(row[:7]), 0.0
        return None, max(0.05, sleep_s)

    @staticmethod
    def _post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> None:
        """POST within one overall deadline (core/http.py); returns on 2xx, raises HttpFailure otherwise."""
        http.request("POST", url, timeout_s=timeout_s, limit=MAX_RESPONSE, body=body, headers=headers,
                     error_limit=200)

    def _attempt(self, seq: int, url: str, source: str, body: str, key: str, timeout_s: float,
                 attempts: int) -> None:
        headers = {**self.headers_for(source), "Content-Type": "application/json", "Idempotency-Key": key,
                   "User-Agent": "edge-runtime-webhook", "Connection": "close"}
        ok, permanent, timed_out, error = True, False, False, None
        try:
            self._post(url, body.encode(), headers, timeout_s)
        except http.HttpFailure as exc:  # an HTTP error, a timeout, refused, reset, DNS, a bad answer
            ok, timed_out, status = False, exc.timed_out, exc.status
            # A retryable 4xx waits for a fix in the config or at the receiver; a row whose rule action was
            # removed or now posts elsewhere would never get one, and it would hold back every later row of
            # its destination (their order is kept): set aside.
            permanent = status is not None and 400 <= status < 500 and status not in RETRYABLE_4XX
            error = f"timeout: {exc}" if timed_out else f"HTTP {status}" if status is not None else str(exc)
        if error is not None:
            error = clean_error(error)
        # A row whose rule action is gone from the running config, or now posts to another URL, can never be
        # fixed there (a removed rule sends no headers; a corrected URL is not this row's): waiting would hold
        # back its line for good, so its first failure, whatever it is, sets it aside.
        orphan = not ok and not self.current(source, url)
        permanent = permanent or orphan
        dest = origin(url)
        with self._lock:
            d = self._dests.setdefault(dest, _Dest())
            d.in_flight_since = None
            if ok:
                self._db.execute("DELETE FROM webhook_outbox WHERE seq = ?", (seq,))
                d.delivered += 1
                d.consecutive_failures = 0
                d.last_error = None
            else:
                delay = min(self.backoff_max_s, self.backoff_min_s * 2 ** min(attempts, 20))
                self._db.execute("UPDATE webhook_outbox SET attempts = attempts + 1, next_try = ?, failed = ?, "
                                 "last_error = ? WHERE seq = ?", (time.time() + delay, int(permanent), error, seq))
                d.attempts_failed += 1
                # A refused payload keeps its destination shown as blocked until a delivery there succeeds
                # (alerts thrown away must show); an orphan's failure says nothing of the destination.
                d.consecutive_failures = 0 if orphan else d.consecutive_failures + 1
                d.timeouts += int(timed_out)
                d.last_error = error
        if ok:
            self.delivered += 1
            self.last_error = None
        else:
            self.attempts_failed += 1
            self.last_error = error
            last, at = self._logged.get(dest, (None, -60.0))
            now = time.monotonic()
            if error != last or now >= at + 60:  # one line per destination and error a minute
                log.warning("webhooks: POST %s failed (%s); %s", url[:200], error,
                            "set aside" if permanent else "will retry")
                self._logged[dest] = (error, now)
        if permanent and ok is False:
            self._wake.set()  # the next row of this destination is due now

    def blocked(self) -> list[str]:
        """Destinations failing now or with a POST in flight over 5 s; cheap (no query), for health."""
        now = time.time()
        with self._lock:
            return sorted(o for o, d in self._dests.items() if d.consecutive_failures > 0
                          or (d.in_flight_since is not None and now - d.in_flight_since > 5))

    def status(self) -> dict[str, Any]:
        now = time.time()
        with self._lock:
            pending, failed = self._db.execute(
                "SELECT COALESCE(SUM(failed = 0), 0), COALESCE(SUM(failed = 1), 0) FROM webhook_outbox").fetchone()
            per: dict[str, dict[str, Any]] = {}
            for url, n, next_try in self._db.execute(
                    "SELECT url, COUNT(*), MIN(next_try) FROM webhook_outbox WHERE failed = 0 GROUP BY url"):
                p = per.setdefault(origin(url), {"pending": 0, "next_try": next_try})
                p["pending"] += n
                p["next_try"] = min(p["next_try"], next_try)
            for o in [o for o in self._dests if o not in per and o not in self._busy]:
                if len(self._dests) > MAX_DESTINATIONS:  # destinations no longer used: forget them
                    del self._dests[o]
            dests: dict[str, dict[str, Any]] = {}
            for o in sorted(set(per) | set(self._dests), key=lambda o: -per.get(o, {}).get("pending", 0)):
                d = self._dests.get(o, _Dest())
                p = per.get(o, {"pending": 0, "next_try": None})
                nt = p["next_try"]
                dests[o] = {"pending": p["pending"],
                            "in_flight_since": d.in_flight_since,
                            "in_flight_s": round(now - d.in_flight_since, 1) if d.in_flight_since else None,
                            "last_error": d.last_error, "consecutive_failures": d.consecutive_failures,
                            "next_try": nt, "next_try_in_s": max(0.0, round(nt - now, 1)) if nt else None,
                            "delivered": d.delivered, "attempts_failed": d.attempts_failed,
                            "timeouts": d.timeouts}
                if len(dests) >= MAX_DESTINATIONS:
                    break
        blocked = sorted(o for o, d in dests.items() if d["consecutive_failures"] > 0
                         or (d["in_flight_s"] or 0) > 5)
        return {"pending": int(pending), "failed": int(failed), "delivered": self.delivered,
                "dropped": self.dropped, "attempts_failed": self.attempts_failed, "last_error": self.last_error,
                "blocked": blocked, "destinations": dests}

    def close(self) -> None:
        self.stop()
        with self._lock:
            self._db.close()
