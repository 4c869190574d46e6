"""The gate's threshold from labelled parts (the exact bound), and `eval --gate` in the report."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import pytest

from edge_runtime.cli.main import main
from edge_runtime.evaluation.gate_eval import measure
from edge_runtime.evaluation.gate_threshold import bad_parts_needed, choose_threshold, curve, escape_upper
from tests.support.parts import clean_part, defective_part

W = 224


def test_the_escape_bound_is_the_exact_one_sided_clopper_pearson() -> None:
    assert escape_upper(0, 100) == pytest.approx(1 - 0.05 ** (1 / 100))
    assert escape_upper(0, 3000) == pytest.approx(0.000998, abs=2e-6)  # the rule of three: ~3/n
    assert escape_upper(1, 100) == pytest.approx(0.0466, abs=1e-4)  # beta.ppf(0.95, 2, 99)
    assert escape_upper(5, 5) == 1.0 and escape_upper(0, 0) == 1.0
    assert bad_parts_needed(0.001) == 2995 and bad_parts_needed(0.1) == 29
    with pytest.raises(ValueError):
        bad_parts_needed(0)


def test_the_highest_threshold_whose_bound_meets_the_target_is_chosen() -> None:
    bad = [float(i) for i in range(10, 110)]  # 100 defective parts scoring 10..109
    good = [1.0, 2.0, 50.0]
    found = choose_threshold(good, bad, 0.05)
    # k escapes are allowed while the bound stays under 5%: k = 1 (4.66%), not k = 2 (6.2%)
    assert found["supported"] and found["escapes"] == 1 and found["value"] == 11.0
    assert found["gated_good"]["count"] == 2  # the good parts under 11 skip the language model


def test_too_few_defective_parts_are_said_to_be_too_few() -> None:
    found = choose_threshold([1.0], [5.0, 6.0, 7.0], 0.001)
    assert not found["supported"] and found["value"] == 5.0 and found["bad_parts_needed"] == 2995
    assert "cannot support an escape rate under 0.100%" in found["note"]
    none = choose_threshold([1.0], [], 0.01)
    assert none["value"] is None and "no defective part" in none["note"]


def test_the_curve_runs_from_everything_flagged_to_everything_gated() -> None:
    pts = curve([1.0, 2.0], [3.0, 4.0])
    assert pts[0]["gated"] == 0.0 and pts[0]["false_reject"] == 1.0
    assert pts[-1]["gated"] == 1.0 and pts[-1]["escape"] == 1.0
    assert [p["escape"] for p in pts] == sorted(p["escape"] for p in pts)


def test_skip_ok_on_the_set_gates_low_scores_and_keeps_the_models_verdict_for_the_rest() -> None:
    rows = [{"id": "g1", "bad": False, "score": 0.1, "vlm_defect": True},   # gated: the model's false reject saved
            {"id": "g2", "bad": False, "score": 0.9, "vlm_defect": True},   # flagged, and the model rejects it
            {"id": "b1", "bad": True, "score": 0.2, "vlm_defect": True},    # a gate escape
            {"id": "b2", "bad": True, "score": 0.8, "vlm_defect": False}]   # the model's own escape
    m = measure(rows, 0.5)
    assert m["escape_ids"] == ["b1"] and m["false_reject_ids"] == ["g2"] and m["calls_saved"]["count"] == 2
    s = m["skip_ok"]
    assert s["escape"]["count"] == 2 and s["false_reject"]["count"] == 1
    assert s["language_model_alone"]["escape"]["count"] == 1 and s["language_model_alone"]["false_reject"]["count"] == 2


def test_skip_ok_on_a_programs_set_takes_the_gates_ok_for_the_regions_under_their_threshold() -> None:
    """A frame sent on for its regions over their threshold: the daemon asks the model only about those
    and answers the others OK. A defect the model found in a region the gate answered is an escape of
    skip_ok, not a catch; a false reject the model made there is saved."""
    def row(rid: str, bad: bool, ratios: dict[str, float], regions: dict[str, bool | None]) -> dict[str, object]:
        worst = max(ratios, key=lambda n: ratios[n])
        return {"id": rid, "bad": bad, "score": ratios[worst], "region": worst, "ratios": ratios,
                "vlm_defect": any(v for v in regions.values()), "region_defects": regions}

    rows = [row("b1", True, {"a": 0.5, "b": 2.0}, {"a": True, "b": False}),   # defect in a, answered by the gate
            row("b2", True, {"a": 0.5, "b": 2.0}, {"a": False, "b": True}),   # defect in b, asked: caught
            row("g1", False, {"a": 0.5, "b": 2.0}, {"a": True, "b": False}),  # the model's false reject in a: saved
            row("g2", False, {"a": 1.5, "b": 0.2}, {"a": True, "b": False})]  # in a, asked: still rejected
    s = measure(rows, 1.0)["skip_ok"]
    assert s["escape"]["count"] == 1 and s["false_reject"]["count"] == 1
    assert s["language_model_alone"]["escape"]["count"] == 0
    assert s["language_model_alone"]["false_reject"]["count"] == 2


def labelled_set(tmp_path: Path, demo_dir: Path) -> tuple[Path, Path]:
    """A bank fitted on clean parts, and labels for three good and three defective parts."""
    ok = tmp_path / "ok"
    ok.mkdir()
    for s in range(20):
        cv2.imwrite(str(ok / f"p{s}.png"), clean_part(s, W, W))
    bank = tmp_path / "g.bank"
    assert main(["gate", "fit", str(ok), str(bank), "--model", str(demo_dir), "--quiet",
                 "--data-dir", str(tmp_path)]) == 0
    lines = []
    for s in range(3):
        cv2.imwrite(str(tmp_path / f"g{s}.png"), clean_part(500 + s, W, W))
        cv2.imwrite(str(tmp_path / f"b{s}.png"), defective_part(600 + s, "stain", 32, W, W)[0])
        lines += [json.dumps({"image": f"g{s}.png", "defect": False}),
                  json.dumps({"image": f"b{s}.png", "defect": True})]
    (tmp_path / "labels.jsonl").write_text("\n".join(lines) + "\n")
    return bank, tmp_path / "labels.jsonl"


def test_eval_with_a_gate_reports_its_rates_curve_and_calls_saved(demo_dir: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bank, labels = labelled_set(tmp_path, demo_dir)
    cv2.imwrite(str(tmp_path / "odd.png"), clean_part(9, 320, 240))
    with labels.open("a") as f:
        f.write(json.dumps({"image": "odd.png", "defect": False}) + "\n")
    capsys.readouterr()
    out = tmp_path / "eval"
    assert main(["eval", str(tmp_path / "labels.jsonl"), "--model", str(demo_dir), "--gate", str(bank), "--out",
                 str(out), "--quiet", "--data-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "gate escape rate" in printed and "language-model calls saved" in printed
    report = json.loads((out / "report.json").read_text())
    gate = report["gate"]
    assert gate["scored"] == 6 and gate["left_out"] == {"gate_refused": 1}  # the 320x240 image, one line
    assert "320x240" in gate["issues"][0]
    assert gate["escape"]["of"] == 3 and gate["false_reject"]["of"] == 3 and gate["curve"]
    assert json.loads((out / "summary.json").read_text())["gate"]["calls_saved"]["of"] == 6
    page = (out / "report.html").read_text()
    assert "Anomaly gate" in page and "language-model calls saved" in page and page.count("data:image/png") >= 2


def test_eval_refuses_a_gate_file_that_is_not_a_bank_before_loading_a_model(
        demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.bank").write_bytes(b"nope")
    (tmp_path / "a.png").write_bytes(b"")
    (tmp_path / "l.jsonl").write_text('{"image": "a.png", "defect": true}\n')
    code = main(["eval", str(tmp_path / "l.jsonl"), "--gate", str(tmp_path / "x.bank"), "--model", str(demo_dir),
                 "--out", str(tmp_path / "o"), "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "not a gate bank file" in err and "Traceback" not in err


def test_the_held_out_threshold_says_its_largest_good_part_is_at_it_not_under_it() -> None:
    """Without labelled data the threshold is the held-out good parts' largest score; a part is gated only
    under the threshold, so that part is not gated and the note must not say every one scores under it."""
    from edge_runtime.evaluation.gate_fit import _threshold

    held = {"images": 8, "max": 0.42, "p99": 0.41, "p50": 0.3, "min": 0.2}
    th = _threshold(held, None, None)
    assert th.value == 0.42 and not th.supported
    assert "scores under it" not in (th.note or "") and "at or under it" in (th.note or "")
