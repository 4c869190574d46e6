"""The evidence folder removed under a running store (a technician's `rm -rf` to free space, a cleanup
script): the next image makes the folder again and is kept. It made the device `degraded` with
`evidence disk full` for good (the free-space check stat'ed the missing folder: ENOENT), on a disk
with room to spare, until a restart."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from edge_runtime.config import EvidenceConfig
from edge_runtime.verdicts.evidence import FAULT, EvidenceStore
from edge_runtime.verdicts.journal import Journal
from tests.verdicts.test_evidence import PASS, noise, result

DEFECT = {"defect": True, "category": "scratch"}


def test_a_removed_evidence_folder_is_made_again_by_the_next_image_and_no_fault_is_raised(tmp_path: Path) -> None:
    faults: set[str] = set()
    store = EvidenceStore(EvidenceConfig(min_free_mb=0), tmp_path / "ev", tmp_path / "j.sqlite3", faults)
    first = store.save(np.full((64, 64, 3), 10, np.uint8), "r1", DEFECT)
    assert first is not None
    shutil.rmtree(tmp_path / "ev")
    second = store.save(np.full((64, 64, 3), 200, np.uint8), "r2", DEFECT)
    assert second is not None and FAULT not in faults
    found = store.lookup("r2")
    assert found is not None and found.path.is_file()
    # The first image went with the folder: the same picture again is written again, not assumed kept.
    again = store.save(np.full((64, 64, 3), 10, np.uint8), "r3", DEFECT)
    assert again is not None and again["sha256"] == first["sha256"]
    found = store.lookup("r3")
    assert found is not None and found.path.is_file()


def _undelivered_store(tmp_path: Path) -> tuple[Journal, EvidenceStore]:
    journal = Journal(tmp_path / "j.sqlite3")
    store = EvidenceStore(EvidenceConfig(max_mb=1, min_free_mb=0, keep_passes=1), tmp_path / "ev",
                          tmp_path / "j.sqlite3", keep_undelivered=True)
    return journal, store


def _save(journal: Journal, store: EvidenceStore, i: int) -> bool:
    journal.add(result(i))  # not delivered: the broker is down
    return store.save(noise(i), f"r{i}", PASS) is not None


def _on_disk(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_a_removed_folder_of_undelivered_evidence_frees_its_budget(tmp_path: Path) -> None:
    """The broker is down (nothing delivered, so nothing may be deleted) and the technician removes the
    folder to make room: the images that went with it no longer count against the budget. Their rows
    stayed: 9 more images fitted, then `evidence disk full` with 9 images on disk and ~1 MB counted."""
    journal, store = _undelivered_store(tmp_path)
    assert all(_save(journal, store, i) for i in range(12))  # ~85 kB each against 1 MB
    shutil.rmtree(tmp_path / "ev")
    for i in range(100, 112):
        assert _save(journal, store, i), f"save {i - 100} refused; counted {store.used_bytes()} B, " \
                                         f"on disk {_on_disk(tmp_path / 'ev')} B"
    assert FAULT not in store.faults
    assert store.used_bytes() == _on_disk(tmp_path / "ev")
    assert store.lookup("r0") is None and store.lookup("r111") is not None
    assert store.status()["files"] == 12
    # The results whose image went with the folder keep no evidence row pointing at a missing file.
    gone = [f"r{i}" for i in range(12)]
    rows = store._db.execute(f"SELECT COUNT(*) FROM evidence WHERE result_id IN ({','.join('?' * 12)})", gone)
    assert rows.fetchone()[0] == 0


def test_removed_subfolders_of_undelivered_evidence_free_their_budget(tmp_path: Path) -> None:
    """`rm -rf ev/*`: the folder stays, its contents go; a full budget looks for files gone before it
    reports the disk full."""
    journal, store = _undelivered_store(tmp_path)
    assert all(_save(journal, store, i) for i in range(12))
    for sub in (tmp_path / "ev").iterdir():
        shutil.rmtree(sub)
    assert all(_save(journal, store, i) for i in range(100, 112))
    assert FAULT not in store.faults and store.used_bytes() == _on_disk(tmp_path / "ev")


def test_a_victim_found_missing_drops_every_row_whose_file_is_gone(tmp_path: Path) -> None:
    """No outbox: anything may go. Deleting for room finds its first victim already gone, so the
    others removed with it stop counting at once, not one phantom per write."""
    store = EvidenceStore(EvidenceConfig(max_mb=1, min_free_mb=0, keep_passes=1), tmp_path / "ev",
                          tmp_path / "j.sqlite3", keep_undelivered=False)
    assert all(store.save(noise(i), f"r{i}", PASS) is not None for i in range(12))
    for sub in (tmp_path / "ev").iterdir():
        shutil.rmtree(sub)
    for i in range(100, 105):  # the budget was nearly full: these make room
        assert store.save(noise(i), f"r{i}", PASS) is not None
    assert store.used_bytes() == _on_disk(tmp_path / "ev")
    assert store.status()["files"] == 5
