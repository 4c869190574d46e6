"""`edge-runtime gate fit | show | score` on the demo bundle: a bank made from a folder, from the
journal's reviewed OK results, with a threshold from labelled parts; every bad input one line, exit 2."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from edge_runtime.cli.main import main
from edge_runtime.inference.anomaly import read_header
from tests.support.parts import clean_part, defective_part

W = 224


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ok")
    for s in range(30):
        cv2.imwrite(str(folder / f"part{s:03d}.png"), clean_part(s, W, W))
    return folder


@pytest.fixture(scope="module")
def bank(good_dir: Path, demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bank") / "parts.bank"
    assert main(["gate", "fit", str(good_dir), str(out), "--model", str(demo_dir), "--quiet",
                 "--data-dir", str(out.parent)]) == 0
    return out


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("edge-runtime")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_gate_fit_writes_a_bank_with_its_held_out_check_and_a_config_line(
        bank: Path, good_dir: Path, demo_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    header = read_header(bank)
    assert header.fit["images"] == 24 and header.fit["held_out"]["images"] == 6
    assert header.threshold.value == pytest.approx(header.fit["held_out"]["max"])
    assert not header.threshold.supported  # no defective part seen: no escape claim
    assert main(["gate", "show", str(bank)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["vectors"]["sha256"] == header.vectors.sha256 and shown["encoder"]["file"] == "vision.onnx"


def test_gate_score_scores_an_image_and_draws_its_heat_map(bank: Path, demo_dir: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    image, _ = defective_part(3, "stain", 32, W, W)
    cv2.imwrite(str(tmp_path / "bad.png"), image)
    png = tmp_path / "heat.png"
    assert main(["gate", "score", str(tmp_path / "bad.png"), "--bank", str(bank), "--model", str(demo_dir),
                 "--heat-map", str(png), "--data-dir", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["score"] > out["threshold"] and out["gated"] is False
    drawn = cv2.imread(str(png))
    assert drawn is not None and drawn.shape == image.shape and bool(np.any(drawn != image))


@pytest.mark.parametrize(("case", "says"), [
    ("missing", "no such folder"),
    ("empty", "no image file in it"),
    ("one_other_size", "224x224 (as"),
    ("all_corrupt", "0 usable good images of 3 read"),
    ("too_few", "the gate needs at least 3"),
    ("no_out", "give the bank file to write"),
    ("bad_escape", "--max-escape"),
    ("zero_escape", "--max-escape"),
    ("bad_holdout", "--holdout"),
    ("unknown_camera", "no camera of that name"),
    ("negative_seed", "--seed must be 0 or more"),
])
def test_a_bad_fit_input_is_one_line_and_exit_2(case: str, says: str, good_dir: Path, demo_dir: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    extra: list[str] = []
    if case == "missing":
        folder = tmp_path / "nope"
    elif case == "empty":
        (folder / "notes.txt").write_text("not an image")
    elif case == "one_other_size":
        for s in range(4):
            cv2.imwrite(str(folder / f"a{s}.png"), clean_part(s, W, W))
        cv2.imwrite(str(folder / "b.png"), clean_part(9, 320, 240))
        says = f"{folder / 'b.png'}: 320x240, but the bank's frames are 224x224 (as"
    elif case == "all_corrupt":
        for s in range(3):
            (folder / f"x{s}.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    elif case == "too_few":
        cv2.imwrite(str(folder / "a.png"), clean_part(0, W, W))
    else:
        folder = good_dir
        extra = {"no_out": [], "bad_escape": ["--max-escape", "lots"], "zero_escape": ["--max-escape", "0"],
                 "bad_holdout": ["--holdout", "1"], "unknown_camera": ["--camera", "nope"],
                 "negative_seed": ["--seed", "-1"]}[case]
    out = [] if case == "no_out" else [str(tmp_path / "o.bank")]
    code = main(["gate", "fit", str(folder), *out, *extra, "--model", str(demo_dir), "--quiet",
                 "--data-dir", str(tmp_path)])
    assert code == 2
    assert says in _one_line(capsys)
    assert not (tmp_path / "o.bank").exists()


def test_a_folder_of_100000_files_is_listed_by_name_and_only_the_chosen_ones_are_read(
        demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(100_000):
        os.close(os.open(folder / f"img{i:06d}.png", os.O_CREAT | os.O_WRONLY, 0o644))
    t0 = time.perf_counter()
    code = main(["gate", "fit", str(folder), str(tmp_path / "o.bank"), "--model", str(demo_dir), "--quiet",
                 "--data-dir", str(tmp_path)])
    took = time.perf_counter() - t0
    assert code == 2
    line = _one_line(capsys)
    assert "0 usable good images of 500 read" in line and "the image is empty" in line
    assert took < 20, took  # 500 empty files read, 99,500 never opened


@pytest.mark.parametrize(("case", "says"), [
    ("corrupt", "corrupt (its sha256 does not match"),
    ("not_a_bank", "not a gate bank file"),
    ("missing", "no such file"),
    ("over_bound", "over the bound of 0.01 MiB"),
])
def test_a_bad_bank_is_one_line_and_exit_2(case: str, says: str, bank: Path, demo_dir: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    cv2.imwrite(str(tmp_path / "part.png"), clean_part(1, W, W))
    path, extra = tmp_path / "b.bank", []
    data = bank.read_bytes()
    if case == "corrupt":
        path.write_bytes(data[:-5] + bytes([data[-5] ^ 0xFF]) + data[-4:])
    elif case == "not_a_bank":
        path.write_bytes(b"hello")
    elif case == "over_bound":
        path, extra = bank, ["--max-bank-mb", "0.01"]
    code = main(["gate", "score", str(tmp_path / "part.png"), "--bank", str(path), *extra, "--model", str(demo_dir),
                 "--data-dir", str(tmp_path)])
    assert code == 2
    assert says in _one_line(capsys)
    if case == "corrupt":
        assert main(["gate", "show", str(path)]) == 2
        assert says in _one_line(capsys)


@pytest.mark.parametrize(("case", "says"), [
    ("folder", "cannot be written (Is a directory)"),
    ("full_disk", "cannot be written (No space left on device)"),
    ("not_an_image_name", "give a .png or .jpg path"),
])
def test_a_heat_map_that_cannot_be_written_is_one_line_and_exit_2(case: str, says: str, bank: Path, demo_dir: Path,
                                                                  tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cv2.imwrite(str(tmp_path / "part.png"), clean_part(1, W, W))
    heat = tmp_path / "heat.png"
    if case == "folder":
        heat.mkdir()
    elif case == "full_disk":
        heat.symlink_to("/dev/full")  # every write: ENOSPC
    else:
        heat = tmp_path / "heat.txt"
    code = main(["gate", "score", str(tmp_path / "part.png"), "--bank", str(bank), "--model", str(demo_dir),
                 "--heat-map", str(heat), "--data-dir", str(tmp_path)])
    assert code == 2
    assert says in _one_line(capsys)


def _labelled(folder: Path, good: int, bad: int) -> Path:
    lines = []
    for s in range(good):
        cv2.imwrite(str(folder / f"g{s}.png"), clean_part(5000 + s, W, W))
        lines.append(json.dumps({"image": f"g{s}.png", "defect": False}))
    for s in range(bad):
        cv2.imwrite(str(folder / f"b{s}.png"), defective_part(6000 + s, ("stain", "missing_hole")[s % 2], 24, W, W)[0])
        lines.append(json.dumps({"image": f"b{s}.png", "defect": True}))
    (folder / "labels.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "labels.jsonl"


def test_too_few_defective_parts_cannot_support_the_escape_claim_and_it_says_so(
        good_dir: Path, demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    labels = _labelled(tmp_path, 6, 6)
    out = tmp_path / "o.bank"
    assert main(["gate", "fit", str(good_dir), str(out), "--labelled", str(labels), "--max-escape", "10%",
                 "--model", str(demo_dir), "--quiet", "--data-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "cannot support an escape rate under 10.000%: 6 defective parts bound it at 39.30%" in text
    assert "needs at least 29 defective parts" in text and "NOT an escape claim" in text
    header = read_header(out)
    assert not header.threshold.supported and header.threshold.value == pytest.approx(header.fit["labelled"]["bad_min"])


def test_enough_defective_parts_give_a_supported_threshold(good_dir: Path, demo_dir: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    labels = _labelled(tmp_path, 4, 30)
    out = tmp_path / "o.bank"
    assert main(["gate", "fit", str(good_dir), str(out), "--labelled", str(labels), "--max-escape", "10%",
                 "--model", str(demo_dir), "--quiet", "--data-dir", str(tmp_path)]) == 0
    header = read_header(out)
    assert header.threshold.supported and header.threshold.target_escape == pytest.approx(0.1)
    assert header.threshold.value is not None and header.threshold.value <= header.fit["labelled"]["bad_min"] + 1e-9
    assert "escape under 10.000% at 95% confidence: 0 of 30" in capsys.readouterr().out


def test_fit_from_the_journal_uses_the_results_reviewed_as_ok(demo_dir: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from edge_runtime.config.schema import Config
    from edge_runtime.core.result import FrameInfo, Result
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
    for i in range(8):
        r = Result(device="d", camera="a", frame=FrameInfo(i, W, W), verdict=verdict, text="", model="m",
                   timings_ms={}, prompt="p")
        journal.add(r)
        evidence.save(clean_part(i, W, W), r.id, verdict)
        if i == 7:  # a technician found a defect: not a good part
            reviews.write(r.to_dict(), "correct", {**verdict, "defect": True, "category": "stain"})
        elif i != 6:  # result 6 was never reviewed
            reviews.write(r.to_dict(), "confirm")
    for store in (reviews, evidence, journal):
        store.close()
    out = tmp_path / "j.bank"
    assert main(["gate", "fit", "--from-journal", str(out), "--model", str(demo_dir), "--quiet",
                 "--data-dir", str(tmp_path)]) == 0
    assert "6 results reviewed as OK from the journal" in capsys.readouterr().out
    header = read_header(out)
    assert header.fit["source"] == "journal" and header.fit["images"] + header.fit["held_out"]["images"] == 6


def test_a_cameras_roi_is_cut_for_the_bank_and_a_bank_of_that_crop_is_refused_without_it(
        good_dir: Path, demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("cameras:\n  - name: station-a\n    source: /dev/null\n    roi: [16, 16, 192, 192]\n")
    out = tmp_path / "roi.bank"
    common = ["--model", str(demo_dir), "--config", str(config), "--data-dir", str(tmp_path)]
    assert main(["gate", "fit", str(good_dir), str(out), "--camera", "station-a", "--quiet", *common]) == 0
    header = read_header(out)
    assert header.region == (16, 16, 192, 192) and (header.layout.width, header.layout.height) == (192, 192)
    cv2.imwrite(str(tmp_path / "part.png"), clean_part(40, W, W))
    capsys.readouterr()
    assert main(["gate", "score", str(tmp_path / "part.png"), "--bank", str(out), "--camera", "station-a",
                 *common]) == 0
    assert json.loads(capsys.readouterr().out)["score"] > 0
    assert main(["gate", "score", str(tmp_path / "part.png"), "--bank", str(out), *common]) == 2
    assert "fitted on crop [16, 16, 192, 192], but these frames are cut to the whole frame" in _one_line(capsys)


def test_three_good_images_are_enough_to_fit_and_hold_one_out(demo_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "three"
    folder.mkdir()
    for s in range(3):
        cv2.imwrite(str(folder / f"p{s}.png"), clean_part(s, W, W))
    out = tmp_path / "three.bank"
    assert main(["gate", "fit", str(folder), str(out), "--model", str(demo_dir), "--quiet",
                 "--data-dir", str(tmp_path)]) == 0
    header = read_header(out)
    assert header.fit["images"] == 2 and header.fit["held_out"]["images"] == 1


def test_fit_show_and_score_on_a_cameras_program_with_regions(
        good_dir: Path, demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("programs:\n  halves:\n    regions:\n      - {name: left, box: [0, 0, 112, 224]}\n"
                      "      - {name: right, box: [112, 0, 112, 224]}\n"
                      "cameras:\n  - {name: belt, source: /dev/null, program: halves}\n")
    out = tmp_path / "halves.bank"
    common = ["--model", str(demo_dir), "--config", str(config), "--data-dir", str(tmp_path)]
    assert main(["gate", "fit", str(good_dir), str(out), "--camera", "belt", "--quiet", *common]) == 0
    assert "region left [0, 0, 112, 224]: a bank of" in capsys.readouterr().out
    assert main(["gate", "show", str(out)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [h["part"]["name"] for h in shown] == ["left", "right"]
    image = clean_part(41, W, W).copy()
    cv2.circle(image, (168, 112), 12, (25, 30, 35), -1)  # a stain in the right half
    cv2.imwrite(str(tmp_path / "part.png"), image)
    assert main(["gate", "score", str(tmp_path / "part.png"), "--bank", str(out), "--camera", "belt",
                 "--heat-map", str(tmp_path / "heat.png"), *common]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["gated"] is False and [(r["name"], r["gated"]) for r in scored["regions"]] == [
        ("left", True), ("right", False)]
    assert scored["regions"][1]["worst_patch_box"][0] >= 112  # in the image's pixels


@pytest.mark.parametrize("program", [False, True])
def test_a_fit_on_copies_of_one_image_is_one_line_not_a_bank_with_a_threshold_of_0(
        program: bool, demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every held-out copy scores 0 against the fitted copies: a threshold of 0 is refused at load (and on a
    program's regions would divide each region's score by 0), so the fit stops in one line instead."""
    folder = tmp_path / "copies"
    folder.mkdir()
    for s in range(6):
        cv2.imwrite(str(folder / f"p{s}.png"), clean_part(7, W, W))
    args = ["gate", "fit", str(folder), str(tmp_path / "c.bank"), "--model", str(demo_dir), "--quiet",
            "--data-dir", str(tmp_path)]
    if program:  # a camera's program of two halves, with a labelled set
        config = tmp_path / "c.yaml"
        config.write_text("programs:\n  halves:\n    regions:\n      - {name: left, box: [0, 0, 112, 224]}\n"
                          "      - {name: right, box: [112, 0, 112, 224]}\n"
                          "cameras:\n  - {name: belt, source: /dev/null, program: halves}\n")
        args += ["--camera", "belt", "--config", str(config), "--labelled", str(_labelled(tmp_path, 2, 2))]
    assert main(args) == 2
    line = _one_line(capsys)
    assert "held-out good images give no usable threshold: every one scores 0: they are copies" in line
    assert ("region left: " in line) == program
    assert not (tmp_path / "c.bank").exists()
