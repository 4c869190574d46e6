"""The rows of a result's side effects (alerts, webhooks, review marks) share the result's journal
transaction: all durable or none; bounds still hold; wake-ups only after the commit. Real SQLite files
(a real full tmpfs for the disk-full case)."""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.config import EvidenceConfig
from edge_runtime.config.rules import Rule
from edge_runtime.core.errors import StorageFull
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.delivery.mqtt.outbox import MessageOutbox
from edge_runtime.delivery.webhooks import WebhookOutbox
from edge_runtime.inference.inspector import Inspector
from edge_runtime.verdicts.journal import Journal
from edge_runtime.verdicts.messages import MAX_PAYLOAD
from edge_runtime.verdicts.stage import VerdictServices
from tests.support.tmpfs import fill_disk, tmpfs

ACTIONS = [{"type": "alert"}, {"type": "webhook", "url": "http://127.0.0.1:9/hook"}, {"type": "review"}]


def make_result(n: int = 0, notes: str = "") -> Result:
    return Result(device="d", camera="cam", frame=FrameInfo(n, 1, 1), verdict={"defect": True, "notes": notes},
                  text="", model="m", timings_ms={"total": 1.0}, prompt="p")


class Line:
    """A journal and the verdict services on one SQLite file, composed as the pipeline does: the webhook
    outbox is told of each committed result as a sink (verdicts/pipeline.py)."""

    def __init__(self, path: Path, actions: list[dict[str, Any]] | None = None,
                 inspector: Inspector | None = None) -> None:
        self.journal = Journal(path)
        rule = Rule.model_validate({"name": "every", "actions": actions or ACTIONS})
        self.webhooks = WebhookOutbox(path)
        self.notified = 0
        self.services = VerdictServices(EvidenceConfig(enabled=False), [rule], path.parent, path, set(),
                                        lambda: inspector, webhooks=self.webhooks,
                                        messages=MessageOutbox(path, wake=self._notify))

    def _notify(self) -> None:
        self.notified += 1

    def deliver(self, result: Result, image: np.ndarray | None = None, fail_inside: bool = False) -> None:
        self.services.before_journal(image, result)

        def extra(db: sqlite3.Connection) -> None:
            self.services.in_journal(db, result)
            if fail_inside:
                raise RuntimeError("the process fails between the side effects and the commit")

        self.journal.add(result, extra=extra)
        self.services.after_journal(result)
        self.webhooks.notify(result)  # the sinks hear of a result once it is committed

    def rows(self) -> dict[str, int]:
        db = sqlite3.connect(str(self.journal.path))
        try:
            return {t: int(db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])
                    for t in ("results", "mqtt_outbox", "webhook_outbox", "reviews")}
        finally:
            db.close()

    def close(self) -> None:
        self.services.stop()
        self.journal.close()


@pytest.fixture
def line(tmp_path: Path) -> Iterator[Line]:
    line = Line(tmp_path / "j.sqlite3")
    yield line
    line.close()


def test_the_result_and_its_alert_webhook_and_review_rows_commit_together(line: Line) -> None:
    line.deliver(make_result())
    assert line.rows() == {"results": 1, "mqtt_outbox": 1, "webhook_outbox": 1, "reviews": 1}
    assert line.notified == 1 and line.webhooks._wake.is_set()  # woken after the commit


def test_a_failure_before_the_commit_keeps_neither_the_result_nor_its_side_effects(line: Line) -> None:
    with pytest.raises(RuntimeError):
        line.deliver(make_result(), fail_inside=True)
    assert line.rows() == {"results": 0, "mqtt_outbox": 0, "webhook_outbox": 0, "reviews": 0}
    assert line.notified == 0 and not line.webhooks._wake.is_set()
    line.deliver(make_result(1))  # the connection is usable again: the transaction was rolled back
    assert line.rows() == {"results": 1, "mqtt_outbox": 1, "webhook_outbox": 1, "reviews": 1}


def test_an_oversized_alert_is_refused_and_counted_while_the_result_and_its_other_actions_are_kept(
        line: Line) -> None:
    line.deliver(make_result(notes="x" * (MAX_PAYLOAD + 1)))  # the alert and the webhook are over the bound
    assert line.rows() == {"results": 1, "mqtt_outbox": 0, "webhook_outbox": 0, "reviews": 1}
    assert line.services.action_errors == 2 and line.notified == 0


def test_the_outboxes_stay_bounded_when_rows_are_staged_in_the_journal_transaction(tmp_path: Path) -> None:
    line = Line(tmp_path / "j.sqlite3", actions=ACTIONS[:2])
    line.services.messages.max_rows = line.webhooks.max_rows = 5
    try:
        for i in range(12):
            line.deliver(make_result(i))
        assert line.rows() == {"results": 12, "mqtt_outbox": 5, "webhook_outbox": 5, "reviews": 0}
        assert line.webhooks.dropped == 7
    finally:
        line.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")
def test_a_disk_that_fills_during_the_transaction_journals_neither_the_result_nor_its_alert(
        tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk") as disk:
        line = Line(disk / "j.sqlite3", actions=ACTIONS[:1])
        try:
            line.deliver(make_result(0))  # the WAL and its index exist: later writes only add frames
            notes = "x" * 60_000  # the result fits in the space left; the result and its alert do not
            filler = fill_disk(disk)
            os.truncate(filler, filler.stat().st_size - 100 * 1024)
            with pytest.raises(StorageFull):
                line.deliver(make_result(1, notes))
            assert line.notified == 1  # only the first result's alert woke the outbox
            filler.unlink()
            assert line.rows() == {"results": 1, "mqtt_outbox": 1, "webhook_outbox": 0, "reviews": 0}
            assert line.journal.integrity_check() == "ok"
        finally:
            line.close()


def test_a_technicians_review_and_its_mqtt_message_commit_together(tmp_path: Path) -> None:
    line = Line(tmp_path / "j.sqlite3", actions=ACTIONS[:1])
    try:
        result = make_result()
        line.deliver(result)
        db = sqlite3.connect(str(line.journal.path))
        # A real failure inside the transaction, after the review row is written: the message insert aborts.
        db.execute("CREATE TRIGGER refuse BEFORE INSERT ON mqtt_outbox BEGIN SELECT RAISE(ABORT, 'injected'); END")
        db.commit()
        with pytest.raises(sqlite3.IntegrityError):
            line.services.reviews.write(result.to_dict(), "confirm")
        assert line.services.reviews.history(result.id) == []
        assert line.journal.get(result.id)["review"] is None  # type: ignore[index]
        db.execute("DROP TRIGGER refuse")
        db.commit()
        db.close()
        line.services.reviews.write(result.to_dict(), "confirm")
        assert [h["state"] for h in line.services.reviews.history(result.id)] == ["confirmed"]
        assert line.rows()["mqtt_outbox"] == 2 and line.notified == 2  # the alert, then the review message
    finally:
        line.close()


def test_a_full_mqtt_outbox_drops_delivered_messages_before_undelivered_ones(tmp_path: Path) -> None:
    outbox = MessageOutbox(tmp_path / "j.sqlite3", max_rows=5)
    try:
        delivered = [outbox.put("cam/alert", f"old-{i}") for i in range(5)]
        outbox.mark_sent(delivered)
        outbox.put("cam/alert", "pending")
        outbox.put("cam/alert", "new")
        assert [p for _, _, p in outbox.unsent()] == ["pending", "new"]  # delivered rows went instead
        assert outbox.dropped_unsent == 0
        for i in range(4):
            outbox.put("cam/alert", f"more-{i}")
        # Five undelivered messages fill the table; the sixth pushes out the oldest undelivered one.
        assert [p for _, _, p in outbox.unsent()] == ["new", "more-0", "more-1", "more-2", "more-3"]
        assert outbox.dropped_unsent == 1
    finally:
        outbox.close()


def test_an_action_error_that_rolls_back_the_whole_transaction_still_journals_the_result(tmp_path: Path) -> None:
    line = Line(tmp_path / "j.sqlite3")
    try:
        with sqlite3.connect(str(line.journal.path)) as db:  # a corrupt page, an interrupt: SQLite rolls back all
            db.execute("CREATE TRIGGER lose_all AFTER INSERT ON webhook_outbox BEGIN SELECT RAISE(ROLLBACK, 'x'); END")
        line.deliver(make_result())
        assert line.rows()["results"] == 1  # the verdict is kept, without its side effects
        assert line.services.action_errors >= 1
        assert not line.journal._db.in_transaction
    finally:
        line.close()


def test_a_full_outbox_logs_one_line_a_minute_not_one_a_verdict(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    line = Line(tmp_path / "j.sqlite3", actions=ACTIONS[:2])
    line.services.messages.max_rows = line.webhooks.max_rows = 5
    try:
        with caplog.at_level(logging.WARNING):
            for i in range(40):
                line.deliver(make_result(i))
        full = sorted(r.name for r in caplog.records if "outbox full" in r.getMessage())
        # one line each, not 35 each
        assert full == ["edge_runtime.delivery.mqtt.outbox", "edge_runtime.delivery.webhooks"]
        assert line.webhooks.dropped == 35 and line.services.messages.dropped_unsent == 35
    finally:
        line.close()
