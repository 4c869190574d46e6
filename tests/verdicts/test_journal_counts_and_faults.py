"""The journal's counts stay true when another process writes the file; a lone surrogate in a result is
stored (escaped, counted) rather than lost; the "deleted oldest" line is rate-limited with a count."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from pathlib import Path

import pytest

from edge_runtime.verdicts import journal as journal_mod
from edge_runtime.verdicts.journal import Journal
from tests.verdicts.test_journal import make_result


def test_rows_from_another_process_never_make_unsent_negative(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite3")
    j.add(make_result(n=0))
    outside = sqlite3.connect(tmp_path / "j.sqlite3", isolation_level=None)
    for i in range(5):
        outside.execute("INSERT INTO results (id, ts, created, camera, body) VALUES (?, 't', ?, 'c', '{}')",
                        (f"x{i}", time.time()))
    outside.close()
    seqs = [seq for seq, _, _ in j.unsent()]
    assert len(seqs) == 6
    j.mark_sent(seqs)
    assert j.counts()["unsent"] == 0 and j.counts()["total"] == 6
    j.close()


def test_a_lone_surrogate_is_journaled_escaped_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    j = Journal(tmp_path / "j.sqlite3")
    r = make_result()
    r.text = "bad \ud800 text"
    with caplog.at_level(logging.WARNING, logger="edge_runtime.verdicts.journal"):
        j.add(r)
        j.add(make_result(n=1))
    stored = j.get(r.id)
    assert stored is not None and stored["text"] == "bad \ud800 text"
    assert j.escaped == 1 and j.counts()["total"] == 2
    assert sum("lone surrogate" in m for m in caplog.messages) == 1
    (_seq, _, body), _ = j.unsent()
    json.loads(body)
    j.close()


def test_deleted_oldest_is_logged_once_then_rate_limited(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    j = Journal(tmp_path / "j.sqlite3", keep_unsent=False, min_free_mb=10**9)  # always "below" the watermark
    with caplog.at_level(logging.WARNING, logger="edge_runtime.verdicts.journal"):
        for round_ in range(5):
            for i in range(150):
                j.add(make_result(n=round_ * 1000 + i))
            j._next_space_check = 0.0
            j._keep_watermark(time.monotonic())
    lines = [m for m in caplog.messages if "deleted the" in m]
    assert j.pruned >= 500
    assert len(lines) == 1, lines
    monkeypatch.setattr(journal_mod, "PRUNE_LOG_EVERY_S", 0.0)
    for i in range(150):
        j.add(make_result(n=9000 + i))
    j._next_space_check = 0.0
    with caplog.at_level(logging.WARNING, logger="edge_runtime.verdicts.journal"):
        j._keep_watermark(time.monotonic())
    last = [m for m in caplog.messages if "deleted the" in m][-1]
    assert f"{j.pruned} in all" in last
    j.close()
