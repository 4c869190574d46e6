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
