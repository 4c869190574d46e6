"""`eval --gate` never counts a part whose encoding or score is not a finite number as gated: it goes
to the language model (as the daemon's gate step sends such a frame on, tests/inference/
test_gate_refusals.py), is counted and said in one line, and the report stays valid JSON. A bank
whose vectors are not finite is refused when it loads, in one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.cli.main import main
from edge_runtime.core.images import read_image_file
from edge_runtime.evaluation.gate_eval import measure
from edge_runtime.inference.anomaly.bank import read_header, write_bank
from edge_runtime.inference.inspector import Inspector
from tests.evaluation.test_gate_eval import labelled_set


def strict_json(text: str) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_a_part_whose_encoding_is_not_finite_is_not_gated_and_is_counted_in_one_line(
        demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bank, labels = labelled_set(tmp_path, demo_dir)
    # The bank's threshold over every part's score: a part the gate can score is gated.
    header = read_header(bank)
    n, d = header.vectors.patches, header.vectors.dim
    vectors = np.frombuffer(bank.read_bytes()[-n * d * 4:], "<f4").reshape(n, d)
    write_bank(bank, header.model_copy(update={"threshold": header.threshold.model_copy(update={"value": 1e6})}),
               vectors)
    args = ["eval", str(labels), "--model", str(demo_dir), "--gate", str(bank), "--quiet", "--data-dir", str(tmp_path)]
    assert main([*args, "--out", str(tmp_path / "first")]) == 0  # a sound encoder: every part is gated
    assert strict_json((tmp_path / "first" / "report.json").read_text())["gate"]["calls_saved"]["count"] == 6

    # The encoder breaks (NaN out) on one good and one defective part (the model's inference refuses
    # them too: inference_error).
    broken = [read_image_file(tmp_path / name) for name in ("g0.png", "b0.png")]
    encode = Inspector.encode

    def nan_encode(self: Inspector, frame: np.ndarray, *a: Any, **kw: Any) -> Any:
        enc = encode(self, frame, *a, **kw)
        if any(f.shape == frame.shape and np.array_equal(f, frame) for f in broken):
            return dataclasses.replace(enc, embeds=np.full_like(enc.embeds, np.nan))
        return enc

    monkeypatch.setattr(Inspector, "encode", nan_encode)
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "second")]) == 0
    printed = capsys.readouterr().out
    assert "2 images scored a non-finite number" in printed and "counted as not gated" in printed
    gate = strict_json((tmp_path / "second" / "report.json").read_text())["gate"]
    assert gate["scored"] == 6 and gate["not_finite"] == 2
    assert gate["calls_saved"]["count"] == 4  # the two broken parts go to the language model
    assert (gate["escape"]["count"], gate["escape"]["of"]) == (2, 3)  # b0 is not among the gated parts
    assert "b0" not in " ".join(gate["escape_ids"]) and any("g0" in i for i in gate["false_reject_ids"])
    assert len(gate["scores"]["good"]) == 2 and len(gate["scores"]["bad"]) == 2
    assert all(np.isfinite(p["threshold"]) for p in gate["curve"])
    assert "scored a non-finite number" in (tmp_path / "second" / "report.html").read_text()


def test_skip_ok_on_the_set_never_takes_a_part_without_a_finite_score_as_an_ok() -> None:
    rows = [{"id": "b", "bad": True, "score": None, "vlm_defect": True},    # not gated: the model catches it
            {"id": "g", "bad": False, "score": None, "vlm_defect": False}]  # not gated: a call not saved
    m = measure(rows, 0.5)
    assert m["escape"]["count"] == 0 and m["escape"]["of"] == 1 and m["calls_saved"]["count"] == 0
    assert m["false_reject_ids"] == ["g"] and m["skip_ok"]["escape"]["count"] == 0
    assert m["scores"] == {"good": [], "bad": []} and m["curve"] == []


def test_eval_refuses_a_bank_whose_vectors_are_not_finite_in_one_line(
        demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bank, labels = labelled_set(tmp_path, demo_dir)
    header = read_header(bank)
    n, d = header.vectors.patches, header.vectors.dim
    vectors = np.frombuffer(bank.read_bytes()[-n * d * 4:], "<f4").reshape(n, d).copy()
    vectors[0, 0] = np.nan
    write_bank(bank, header, vectors)  # a sound file (its sha256 matches) holding a NaN
    capsys.readouterr()
    code = main(["eval", str(labels), "--model", str(demo_dir), "--gate", str(bank), "--out", str(tmp_path / "o"),
                 "--quiet", "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "corrupt (a value is not a finite number)" in err and "Traceback" not in err


def test_an_infinite_threshold_which_would_gate_every_part_is_refused_in_one_line(
        demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bank, labels = labelled_set(tmp_path, demo_dir)
    args = ["eval", str(labels), "--model", str(demo_dir), "--gate", str(bank), "--out", str(tmp_path / "o"),
            "--quiet", "--data-dir", str(tmp_path)]
    capsys.readouterr()
    assert main([*args, "--gate-threshold", "inf"]) == 2
    assert "--gate-threshold needs --gate and a finite score over 0" in capsys.readouterr().err
    header = read_header(bank)
    n, d = header.vectors.patches, header.vectors.dim
    vectors = np.frombuffer(bank.read_bytes()[-n * d * 4:], "<f4").reshape(n, d)
    write_bank(bank, header.model_copy(update={"threshold": header.threshold.model_copy(
        update={"value": float("inf")})}), vectors)  # the writer takes it (JSON Infinity); the reader refuses it
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and "Infinity is not a JSON number" in err and "Traceback" not in err
