"""A result whose evidence image is gone says so in the journal, instead of a link that answers 404.

Retention (the budget, the age limit) and removals found on disk (a technician's `rm`) dropped the
store's rows but left the results' `evidence.uri`: REST, the exports and the MQTT outbox's unsent rows
kept handing out a link to nothing. Now the journal row's `evidence.uri` becomes null and
`evidence.removed` says when and why (`retention` or `missing`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from edge_runtime.config import EvidenceConfig
from edge_runtime.verdicts.evidence import EvidenceStore
from edge_runtime.verdicts.journal import Journal
from tests.verdicts.test_evidence import PASS, noise, result


def _line(tmp_path: Path, max_mb: float = 1, keep_undelivered: bool = False) -> tuple[Journal, EvidenceStore]:
    journal = Journal(tmp_path / "j.sqlite3", keep_unsent=keep_undelivered)
    store = EvidenceStore(EvidenceConfig(max_mb=max_mb, min_free_mb=0, keep_passes=1), tmp_path / "ev",
                          tmp_path / "j.sqlite3", keep_undelivered=keep_undelivered)
    return journal, store


def _inspect(journal: Journal, store: EvidenceStore, i: int) -> None:
    """As the pipeline does it: the image is kept first, then the result that links it is journaled."""
    r = result(i)
    r.evidence = store.save(noise(i), r.id, PASS)
    assert r.evidence is not None
    journal.add(r)


def test_evidence_deleted_for_the_budget_is_marked_removed_in_its_result(tmp_path: Path) -> None:
    journal, store = _line(tmp_path)
    for i in range(30):  # ~85 kB each against 1 MB: the oldest go
        _inspect(journal, store, i)
    first, last = journal.get("r0"), journal.get("r29")
    assert first is not None and last is not None
    assert store.lookup("r0") is None  # deleted by retention
    assert first["evidence"]["uri"] is None, first["evidence"]
    assert first["evidence"]["removed"]["why"] == "retention"
    assert first["evidence"]["removed"]["at"].endswith("Z")
    assert first["evidence"]["sha256"]  # what it was stays, for the record
    assert last["evidence"]["uri"] == "/api/v1/results/r29/image.jpg" and "removed" not in last["evidence"]


def test_evidence_removed_by_hand_is_marked_missing_when_the_store_finds_it(tmp_path: Path) -> None:
    journal, store = _line(tmp_path, max_mb=100)
    for i in range(3):
        _inspect(journal, store, i)
    found = store.lookup("r1")
    assert found is not None
    found.path.unlink()  # a technician's rm
    assert store.still_kept("r0") and not store.still_kept("r1")
    gone = journal.get("r1")
    assert gone is not None and gone["evidence"]["uri"] is None and gone["evidence"]["removed"]["why"] == "missing"
    assert journal.get("r0")["evidence"]["uri"] == "/api/v1/results/r0/image.jpg"  # type: ignore[index]
    assert not found.thumbnail.exists()


def test_a_removed_folder_marks_every_result_that_linked_it(tmp_path: Path) -> None:
    journal, store = _line(tmp_path, max_mb=100)
    for i in range(4):
        _inspect(journal, store, i)
    shutil.rmtree(tmp_path / "ev")
    _inspect(journal, store, 10)  # the store makes its folder again and forgets what went with it
    for i in range(4):
        assert journal.get(f"r{i}")["evidence"]["removed"]["why"] == "missing"  # type: ignore[index]
    assert journal.get("r10")["evidence"]["uri"] == "/api/v1/results/r10/image.jpg"  # type: ignore[index]


def test_a_link_left_by_an_older_version_is_marked_when_read(tmp_path: Path) -> None:
    """Rows dropped before removals were marked (f523482) left results linking an image the store no
    longer knows: still_kept marks them too."""
    journal, store = _line(tmp_path, max_mb=100)
    _inspect(journal, store, 0)
    found = store.lookup("r0")
    assert found is not None
    found.path.unlink()
    store._db.execute("DELETE FROM evidence WHERE result_id = 'r0'")  # as the older version left it
    assert not store.still_kept("r0")
    assert journal.get("r0")["evidence"]["removed"]["why"] == "missing"  # type: ignore[index]
    # A result that never had an image is left as it is.
    journal.add(result(5))
    assert not store.still_kept("r5") and journal.get("r5")["evidence"] is None  # type: ignore[index]
