"""/api/v1/events mapped its replayed backlog through the journal (e221ed9) after taking a stream slot
and a subscription but outside the code that gives them back: a journal that raised ("database is
locked", a full disk) used up a slot for good, and every stream was a 429 once all were gone. A journal
that cannot be read now replays the event as it was published; any other failure gives the slot back."""

from __future__ import annotations

import sqlite3

from flask import Flask

from edge_runtime.delivery.events import EventHub
from tests.api.test_evidence_route_answers import EVIDENCE, Device, app, device

__all__ = ["app", "device"]  # the fixtures


def _replay(app: Flask) -> tuple[int, bytes]:
    """The status and the first two frames (retry, the replayed event) of a stream resumed after 0."""
    resp = app.test_client().get("/api/v1/events?last_event_id=0", buffered=False)
    try:
        if resp.status_code != 200:
            return resp.status_code, b""
        chunks = iter(resp.response)
        first = [next(chunks, b""), next(chunks, b"")]
        return 200, b"".join(c if isinstance(c, bytes) else str(c).encode() for c in first)
    finally:
        resp.close()


def test_a_journal_that_cannot_be_read_replays_the_event_as_published(app: Flask, device: Device) -> None:
    hub: EventHub = app.extensions["edge_runtime_events"]
    hub.publish({"id": "r9", "evidence": dict(EVIDENCE)})
    device.journal_error = sqlite3.OperationalError("database is locked")
    status, body = _replay(app)
    assert status == 200 and str(EVIDENCE["uri"]).encode() in body, (status, body)


def test_a_failed_replay_gives_its_stream_slot_back(app: Flask, device: Device) -> None:
    hub: EventHub = app.extensions["edge_runtime_events"]
    streams = app.extensions["edge_runtime_streams"]
    hub.publish({"id": "r9", "evidence": dict(EVIDENCE)})
    device.journal_error = RuntimeError("the journal failed")  # not a journal read error: the request fails
    app.config["PROPAGATE_EXCEPTIONS"] = False
    for _ in range(streams.max_requests + 1):
        status, _ = _replay(app)
        assert status == 500
    assert streams.in_flight == 0 and not hub._subs
    device.journal_error = None
    status, _ = _replay(app)
    assert status == 200  # not a 429: no slot was used up
