"""The evidence store: atomic content-addressed JPEGs, sampling, budget and age, full disks."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import cv2
import numpy as np

from edge_runtime.config import EvidenceConfig
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.verdicts.evidence import FAULT, EvidenceStore
from edge_runtime.verdicts.journal import Journal
from tests.support.tmpfs import fill_disk, tmpfs

DEFECT = {"defect": True, "category": "scratch"}
PASS = {"defect": False, "category": "none"}


def noise(seed: int, size: tuple[int, int] = (240, 320)) -> np.ndarray:
    """Random pixels compress badly: each image costs tens of kB, so budgets fill fast."""
    return np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)


def store_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in store_files(root))


def test_evidence_is_a_content_named_jpeg_with_a_thumbnail(tmp_path: Path) -> None:
    store = EvidenceStore(EvidenceConfig(thumbnail_px=64), tmp_path / "ev", tmp_path / "j.sqlite3")
    image = noise(1)
    link = store.save(image, "r1", DEFECT)
    assert link is not None
    found = store.lookup("r1")
    assert found is not None
    data = found.path.read_bytes()
    assert link == {"uri": "/api/v1/results/r1/image.jpg", "sha256": hashlib.sha256(data).hexdigest(),
                    "bytes": len(data), "width": 320, "height": 240}
    assert found.path == tmp_path / "ev" / link["sha256"][:2] / f"{link['sha256']}.jpg"
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert decoded is not None
    assert decoded.shape == image.shape
    thumb = cv2.imdecode(np.frombuffer(found.thumbnail.read_bytes(), np.uint8), cv2.IMREAD_COLOR)
    assert thumb is not None
    assert max(thumb.shape[:2]) == 64
    assert not [p for p in store_files(tmp_path / "ev") if p.name.startswith(".tmp")]  # renamed, not left half


def test_identical_frames_share_one_file(tmp_path: Path) -> None:
    store = EvidenceStore(EvidenceConfig(), tmp_path / "ev", tmp_path / "j.sqlite3")
    a, b = store.save(noise(2), "r1", DEFECT), store.save(noise(2), "r2", DEFECT)
    assert a and b and a["sha256"] == b["sha256"]
    assert len(store_files(tmp_path / "ev")) == 2  # one image + one thumbnail
    assert store.lookup("r2") == store.lookup("r1")


def test_every_defect_is_kept_and_passes_are_sampled(tmp_path: Path) -> None:
    store = EvidenceStore(EvidenceConfig(keep_passes=0.25), tmp_path / "ev", tmp_path / "j.sqlite3")
    kept_passes = sum(store.save(noise(i, (32, 32)), f"p{i}", PASS) is not None for i in range(40))
    kept_defects = sum(store.save(noise(100 + i, (32, 32)), f"d{i}", DEFECT) is not None for i in range(10))
    assert (kept_passes, kept_defects) == (10, 10)
    none = EvidenceStore(EvidenceConfig(keep_passes=0), tmp_path / "ev2", tmp_path / "j2.sqlite3")
    assert none.save(noise(1), "p", PASS) is None


def test_budget_holds_under_a_fill_on_a_real_small_disk(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "8m") as disk:
        cfg = EvidenceConfig(max_mb=3, min_free_mb=0, keep_passes=1)
        store = EvidenceStore(cfg, disk / "ev", tmp_path / "j.sqlite3")
        budget = 3 * 1024 * 1024
        for i in range(150):  # ~80 kB each: 12 MB offered to a 3 MB budget on an 8 MB disk
            verdict = DEFECT if i % 10 == 0 else PASS
            assert store.save(noise(i), f"r{i}", verdict) is not None
            assert disk_bytes(disk / "ev") <= budget
        assert store.used_bytes() == disk_bytes(disk / "ev")
        assert store.used_bytes() > budget * 0.8
        # Passes went first: every recent defect is still there, the oldest passes are gone.
        assert all(store.lookup(f"r{i}") for i in range(100, 150, 10))
        assert store.lookup("r1") is None
        assert FAULT not in store.faults


def test_a_full_disk_is_a_fault_not_a_crash_and_heals_when_space_returns(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "8m") as disk:
        faults: set[str] = set()
        store = EvidenceStore(EvidenceConfig(max_mb=100, min_free_mb=0), disk / "ev", tmp_path / "j.sqlite3",
                              faults)
        filler = fill_disk(disk)  # another program fills the disk
        assert store.save(noise(1), "r1", DEFECT) is None
        assert FAULT in faults and store.status()["disk_full"]
        assert store.save(noise(2), "r2", DEFECT) is None  # still no crash, still degraded
        filler.unlink()
        assert store.save(noise(3), "r3", DEFECT) is not None
        assert FAULT not in faults
        assert not [p for p in store_files(disk / "ev") if p.name.startswith(".tmp")]


def result(i: int) -> Result:
    return Result(device="d", camera="c", frame=FrameInfo(i, 1, 1), verdict=PASS, text="", model="m",
                  timings_ms={"total": 1.0}, prompt="p", id=f"r{i}")


def test_evidence_of_an_undelivered_result_is_never_deleted(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    store = EvidenceStore(EvidenceConfig(max_mb=0.5, min_free_mb=0, keep_passes=1), tmp_path / "ev",
                          tmp_path / "j.sqlite3", keep_undelivered=True)
    saved = []
    for i in range(20):  # ~80 kB each against a 0.5 MB budget; none delivered yet
        journal.add(result(i))
        saved.append(store.save(noise(i), f"r{i}", PASS) is not None)
    assert saved[0] and not saved[-1]  # new evidence is refused, old undelivered evidence stays
    assert all(store.lookup(f"r{i}") for i in range(saved.count(True)))
    assert store.used_bytes() <= 0.5 * 1024 * 1024
    journal.mark_sent([row[0] for row in journal.unsent(limit=1000)])
    journal.add(result(99))
    assert store.save(noise(99), "r99", PASS) is not None  # delivered evidence now makes room
    assert store.lookup("r0") is None


def test_age_limit_deletes_old_evidence(tmp_path: Path) -> None:
    store = EvidenceStore(EvidenceConfig(max_age_days=1), tmp_path / "ev", tmp_path / "j.sqlite3")
    store.save(noise(1), "old", DEFECT)
    store.save(noise(2), "new", DEFECT)
    store._db.execute("UPDATE evidence_files SET created = created - 2 * 86400 WHERE sha256 = "
                      "(SELECT sha256 FROM evidence WHERE result_id = 'old')")
    store.apply_retention()
    assert store.lookup("old") is None and store.lookup("new") is not None
    assert len(store_files(tmp_path / "ev")) == 2
    assert os.path.exists(tmp_path / "j.sqlite3")


def test_a_lost_thumbnail_is_made_again_from_the_image(tmp_path: Path) -> None:
    store = EvidenceStore(EvidenceConfig(thumbnail_px=48), tmp_path / "ev", tmp_path / "j.sqlite3")
    store.save(noise(1), "r1", DEFECT)
    found = store.lookup("r1")
    assert found is not None
    found.thumbnail.write_bytes(b"")  # what a power cut can leave of a file that was never fsync'd
    thumb = cv2.imdecode(np.frombuffer(store.thumbnail(found).read_bytes(), np.uint8), cv2.IMREAD_COLOR)
    assert thumb is not None
    assert max(thumb.shape[:2]) == 48


def test_full_frame_is_the_camera_frame_behind_an_roi_crop() -> None:
    from edge_runtime.capture.sources import crop
    from edge_runtime.verdicts.stage import full_frame

    frame = noise(5)
    roi = crop(frame, (10, 20, 100, 50))
    assert roi.shape == (50, 100, 3) and full_frame(roi) is frame
    assert full_frame(frame) is frame  # no crop: the frame itself
    copy = roi.copy()
    assert full_frame(copy) is copy  # not a view: nothing bigger to keep
