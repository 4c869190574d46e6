"""Dataset readers: every layout, and every bad record as one counted line (never a crash)."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import pytest
from edge_runtime_models.demo import DEMO_VERDICT_SCHEMA

from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.core.samples import part_image
from edge_runtime.evaluation import dataset as dsmod
from edge_runtime.evaluation.dataset import open_dataset


def jpg(path: Path, seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), part_image(seed, 64, 48))


def test_jsonl_bad_records_are_one_counted_line_each(tmp_path: Path) -> None:
    for i in range(3):
        jpg(tmp_path / f"p{i}.jpg", i)
    lines = [
        {"id": "a", "image": "p0.jpg", "defect": False, "category": "none"},
        {"id": "b", "image": "missing.jpg", "defect": True},                  # missing image
        {"id": "c", "image": "p1.jpg", "defect": "yes please"},               # not a boolean
        {"id": "d", "image": "p1.jpg", "category": "rust"},                   # not in the enum
        {"id": "e", "image": "p1.jpg", "colour": "red"},                      # not a schema field
        {"id": "a", "image": "p2.jpg", "defect": True},                       # duplicate id
        {"id": "f", "image": "p2.jpg", "label": {"defect": True, "notes": "part missing"}},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\n{not json\n" + json.dumps({"image": "x" * 70000}) + "\n[1]\n"
    (tmp_path / "labels.jsonl").write_text(text)
    ds = open_dataset(tmp_path / "labels.jsonl", DEMO_VERDICT_SCHEMA)
    assert [s.id for s in ds.samples] == ["a", "f"]
    assert ds.samples[1].expected == {"defect": True, "notes": "part missing"}
    assert dict(ds.counts) == {"missing_image": 1, "bad_label": 3, "duplicate_id": 1, "bad_line": 3}
    assert len(ds.issues) == 8 and all("\n" not in line for line in ds.issues)
    assert any("labels.jsonl:2" in line and "no such image file" in line for line in ds.issues)
    assert any("'rust' is not one of" in line for line in ds.issues)
    assert any("'colour' is not in the bundle's verdict schema" in line for line in ds.issues)
    assert any("longer than 64 KiB" in line for line in ds.issues)


def test_csv_cells_are_typed_by_the_schema(tmp_path: Path) -> None:
    jpg(tmp_path / "img" / "a.jpg")
    jpg(tmp_path / "img" / "b.jpg", 1)
    (tmp_path / "l.csv").write_text("image,defect,category,confidence\nimg/a.jpg,true,scratch,0.5\n"
                                    "img/b.jpg,0,,\nimg/b.jpg,maybe,none,\nonly,two\n")
    ds = open_dataset(tmp_path / "l.csv", DEMO_VERDICT_SCHEMA)
    assert [s.expected for s in ds.samples] == [{"defect": True, "category": "scratch", "confidence": 0.5},
                                                {"defect": False}]
    assert dict(ds.counts) == {"bad_label": 1, "bad_line": 1}


def test_export_layout_reads_the_label_of_each_file(tmp_path: Path) -> None:
    """The layout `dataset export` writes: train/<id>.jpg + train/metadata.jsonl with `label`."""
    jpg(tmp_path / "train" / "r1.jpg")
    rows = [{"file_name": "r1.jpg", "id": "r1", "camera": "a", "ts": "2026-12-01T00:00:00Z", "model": "m",
             "prompt": "p", "verdict": {"defect": False}, "review_state": "corrected", "note": None,
             "label": {"defect": True, "category": "scratch", "confidence": 1.0, "notes": "scratch on the face"}}]
    (tmp_path / "train" / "metadata.jsonl").write_text(json.dumps(rows[0]) + "\n")
    ds = open_dataset(tmp_path, DEMO_VERDICT_SCHEMA)
    assert ds.source == "export" and len(ds.samples) == 1
    assert ds.samples[0].id == "r1" and ds.samples[0].expected["defect"] is True


def test_class_folders_map_good_and_bad_to_the_boolean_and_names_to_the_enum(tmp_path: Path) -> None:
    jpg(tmp_path / "b" / "good" / "1.jpg")
    jpg(tmp_path / "b" / "ng" / "2.jpg", 1)
    (tmp_path / "b" / "ng" / "readme.txt").write_text("not an image")
    ds = open_dataset(tmp_path / "b", DEMO_VERDICT_SCHEMA)
    assert sorted((s.id, s.expected["defect"]) for s in ds.samples) == [("good/1.jpg", False), ("ng/2.jpg", True)]
    jpg(tmp_path / "c" / "scratch" / "1.jpg")
    jpg(tmp_path / "c" / "rust" / "2.jpg")
    ds = open_dataset(tmp_path / "c", DEMO_VERDICT_SCHEMA)
    assert [s.expected for s in ds.samples] == [{"category": "scratch"}]
    assert dict(ds.counts) == {"bad_label": 1}


def test_record_and_file_counts_are_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(5):
        jpg(tmp_path / "good" / f"{i}.jpg", i)
    ds = open_dataset(tmp_path, DEMO_VERDICT_SCHEMA, limit=3)
    assert len(ds.samples) == 3 and ds.counts["over_limit"] == 1
    monkeypatch.setattr(dsmod, "MAX_INDEX_BYTES", 100)
    (tmp_path / "big.jsonl").write_text("x" * 200)
    with pytest.raises(EdgeRuntimeError, match="split the dataset"):
        open_dataset(tmp_path / "big.jsonl", DEMO_VERDICT_SCHEMA)


def test_a_path_that_is_no_dataset_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EdgeRuntimeError, match="no such dataset"):
        open_dataset(tmp_path / "nope", DEMO_VERDICT_SCHEMA)
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(EdgeRuntimeError, match="not a dataset"):
        open_dataset(tmp_path / "x.txt", DEMO_VERDICT_SCHEMA)
    loop = tmp_path / "loops"
    jpg(loop / "good" / "1.jpg")
    (loop / "bad").symlink_to(loop / "bad")  # a link to itself: listing it fails
    ds = open_dataset(loop, DEMO_VERDICT_SCHEMA)
    assert len(ds.samples) == 1 and ds.counts["bad_line"] == 1 and "cannot be listed" in ds.issues[0]
    (tmp_path / "h.csv").write_text("file,defect\n")
    with pytest.raises(EdgeRuntimeError, match="'image'"):
        open_dataset(tmp_path / "h.csv", DEMO_VERDICT_SCHEMA)


def test_from_journal_takes_reviewed_results_with_their_evidence(tmp_path: Path) -> None:
    from edge_runtime.config.schema import Config
    from edge_runtime.core.result import FrameInfo, Result
    from edge_runtime.evaluation.journal import journal_dataset
    from edge_runtime.verdicts.evidence import EvidenceStore
    from edge_runtime.verdicts.journal import Journal
    from edge_runtime.verdicts.review import ReviewStore

    config = Config(data_dir=tmp_path)
    db = config.journal_path()
    db.parent.mkdir(parents=True, exist_ok=True)
    journal = Journal(db)
    evidence = EvidenceStore(config.evidence.model_copy(update={"keep_passes": 1}), tmp_path / "evidence", db)
    reviews = ReviewStore(db)
    verdict = {"defect": False, "category": "none", "confidence": 0.9, "notes": "surface clean"}
    results = [Result(device="d", camera="a", frame=FrameInfo(i, 64, 48), verdict=verdict, text="", model="m",
                      timings_ms={}, prompt="p") for i in range(4)]
    for i, r in enumerate(results):
        journal.add(r)
        if i < 3:
            evidence.save(part_image(i, 64, 48), r.id, verdict)
    reviews.write(results[0].to_dict(), "confirm")
    reviews.write(results[1].to_dict(), "correct", {**verdict, "defect": True, "category": "dent"})
    reviews.write(results[3].to_dict(), "confirm")  # reviewed, but no image was kept
    # results[2] is not reviewed: not part of the dataset
    for store in (reviews, evidence, journal):
        store.close()
    ds = journal_dataset(config, DEMO_VERDICT_SCHEMA)
    assert sorted((s.id, s.expected["defect"]) for s in ds.samples) == sorted(
        [(results[0].id, False), (results[1].id, True)])
    assert dict(ds.counts) == {"missing_image": 1}
    assert "no evidence image kept" in ds.issues[0]
