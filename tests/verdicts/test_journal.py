"""The journal keeps every result across restarts, answers queries, and never drops unsent rows."""

from __future__ import annotations

from pathlib import Path

from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.verdicts.journal import Journal


def make_result(camera: str = "cam", n: int = 0) -> Result:
    return Result(device="d", camera=camera, frame=FrameInfo(n, 10, 10), verdict={"defect": False},
                  text='{"defect": false}', model="m@1", timings_ms={"total": 1.0}, prompt="p")


def test_results_survive_reopening(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    results = [make_result(n=i) for i in range(3)]
    for r in results:
        journal.add(r)
    journal.close()
    reopened = Journal(tmp_path / "j.sqlite3")
    assert reopened.counts() == {"total": 3, "unsent": 3, "parked": 0}
    assert reopened.get(results[1].id) == results[1].to_dict()
    assert reopened.get("no-such-id") is None


def test_query_filters_by_camera_and_pages_newest_first(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    for i in range(6):
        journal.add(make_result("left" if i % 2 else "right", i))
    left = journal.query(camera="left")
    assert [r["frame"]["seq"] for r in left] == [5, 3, 1]
    page2 = journal.query(camera="left", limit=2, before_seq=left[1]["journal_seq"])
    assert [r["frame"]["seq"] for r in page2] == [1]
    assert journal.query(since="2100-01-01T00:00:00Z") == []


def test_retention_keeps_unsent_results(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3", max_rows=10)
    for i in range(30):
        journal.add(make_result(n=i))
    journal.apply_retention()
    assert journal.counts()["total"] == 30  # nothing was delivered yet: nothing may go
    journal.mark_sent([seq for seq, _, _ in journal.unsent(limit=25)])
    journal.apply_retention()
    counts = journal.counts()
    assert counts["unsent"] == 5 and counts["total"] == 10


def test_retention_without_an_outbox_drops_the_oldest_unsent_rows(tmp_path: Path) -> None:
    # keep_unsent: false is what the daemon sets when MQTT is off: nothing would ever send these rows.
    journal = Journal(tmp_path / "j.sqlite3", max_rows=10, keep_unsent=False)
    results = [make_result(n=i) for i in range(30)]
    for r in results:
        journal.add(r)
    journal.apply_retention()
    assert journal.counts() == {"total": 10, "unsent": 10, "parked": 0}
    assert [r["frame"]["seq"] for r in journal.query(limit=50)] == list(range(29, 19, -1))  # the newest stay
    assert journal.get(results[0].id) is None


def test_unsent_rows_come_oldest_first(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    for i in range(5):
        journal.add(make_result(n=i))
    rows = journal.unsent(limit=3)
    assert [seq for seq, _, _ in rows] == sorted(seq for seq, _, _ in rows)
    journal.mark_sent([rows[0][0]])
    assert journal.unsent(limit=10)[0][0] == rows[1][0]


def test_counts_are_kept_without_counting_the_table(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    seqs = [journal.add(make_result(n=i)) for i in range(4)]
    journal.mark_sent(seqs[:2])
    journal.mark_sent(seqs[:1])  # an acknowledgement seen twice counts once
    journal.park(seqs[2], "ValueError: Publish topic cannot contain wildcards.")
    assert journal.counts() == {"total": 4, "unsent": 1, "parked": 1}
    journal.close()
    assert Journal(tmp_path / "j.sqlite3").counts() == {"total": 4, "unsent": 1, "parked": 1}


def test_a_parked_row_leaves_the_outbox_with_its_reason(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    seqs = [journal.add(make_result(n=i)) for i in range(3)]
    journal.park(seqs[0], "payload too large")
    assert [seq for seq, _, _ in journal.unsent()] == seqs[1:]
    assert journal.parked() == [(seqs[0], "cam", "payload too large")]
