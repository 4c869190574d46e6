"""User mistakes are one line and exit 2; runs.jsonl survives a half-written last line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge_runtime.cli.main import main
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.evaluation.dataset import Sample
from edge_runtime.evaluation.evaluate import load_prompts, parse_rate
from edge_runtime.evaluation.runner import RunLog, _image_stamp


@pytest.mark.parametrize(("args", "says"), [
    (["eval", "/nonexistent/ds"], "no such dataset"),
    (["eval"], "give a DATASET"),
    (["eval", "x.jsonl", "--from-journal"], "not both"),
    (["eval", "x.jsonl", "--target-escape", "lots"], "--target-escape"),
    (["eval", "x.jsonl", "--target-escape", "150%"], "under 100%"),
    (["eval", "x.jsonl", "--limit", "0"], "--limit"),
    (["eval", "x.jsonl", "--defect", "defect is bad"], "--defect"),
    (["eval", "x.jsonl", "--defect-rule", "nope"], "no rule of that name"),
    (["eval", "x.jsonl", "--prompts", "/nonexistent/p.txt"], "--prompts"),
    (["eval", "DS", "--out", "/proc/version/out"], "--out"),
    (["eval", "DS", *["--model", "M"] * 8], "at most 8 bundles"),
])
def test_a_user_mistake_is_one_line_and_exit_2(args: list[str], says: str, demo_dir: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    ds = tmp_path / "ds.jsonl"
    (tmp_path / "a.jpg").write_bytes(b"")
    ds.write_text('{"image": "a.jpg", "defect": true}\n')
    args = [str(ds) if a == "DS" else str(demo_dir) if a == "M" else a for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "o")]
    code = main([*args, "--model", str(demo_dir), "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("edge-runtime")]
    assert len(lines) == 1 and says in lines[0], err
    assert "Traceback" not in err


def test_rates_are_read_as_percent_or_fraction() -> None:
    assert parse_rate("0.5%") == pytest.approx(0.005)
    assert parse_rate("0.01") == pytest.approx(0.01)


def test_prompt_files_are_bounded(tmp_path: Path) -> None:
    p = tmp_path / "p.json"
    p.write_text(json.dumps(["a", "b"]))
    assert load_prompts(p) == ["a", "b"]
    p.write_text(json.dumps(["x"] * 17))
    with pytest.raises(EdgeRuntimeError, match="1 to 16"):
        load_prompts(p)
    p.write_text(json.dumps(["x" * 5000]))
    with pytest.raises(EdgeRuntimeError, match="at most 4000"):
        load_prompts(p)
    p.write_text("x" * (2 << 20))
    with pytest.raises(EdgeRuntimeError, match="larger than 1 MiB"):
        load_prompts(p)


def test_a_half_written_last_record_is_cut_and_the_next_append_starts_clean(tmp_path: Path) -> None:
    img = tmp_path / "a.jpg"
    img.write_bytes(b"x")
    sample = Sample("a", img, {"defect": True})
    path = tmp_path / "runs.jsonl"
    good = {"key": "k", "id": "a", "stamp": _image_stamp(img), "verdict": {"defect": True}}
    path.write_text(json.dumps(good) + "\n" + '{"key": "k", "id": "b", "verd')
    log = RunLog(path)
    assert log.done("k", sample) and log.unreadable == 0
    log.append([{"key": "k", "id": "b", "stamp": [0, 0], "verdict": {"defect": False}}])
    log.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "b"]
    img.write_bytes(b"changed")  # a changed image is measured again
    again = RunLog(path)
    assert not again.done("k", sample)
    again.close()
