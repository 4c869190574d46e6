"""`edge-runtime eval --program NAME` on the demo bundle: each image inspected under the config's program
(its regions and tiles, as a camera's frames are), a dataset labelling `regions` measured per region
(escape and false-reject, by the same defect rule) beside the overall; bad region labels and programs
are one line each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import pytest

from edge_runtime.cli.main import main
from edge_runtime.core.samples import part_image

PROGRAM_YAML = """\
model: {{path: {model}, threads: 2}}
data_dir: {data}
programs:
  halves:
    regions:
      - {{name: left, box: [0, 0, 80, 120]}}
      - {{name: right, box: [80, 0, 80, 120]}}
"""
CLIP_YAML = """\
  clipped:
    clip: {{frames: 2, spacing_s: 0.1}}
"""


def write_set(folder: Path, n: int) -> Path:
    """n parts; the left half of every third part is labelled bad, every right half good, and one image
    is labelled only by its regions."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        bad = i % 3 == 2
        cv2.imwrite(str(folder / f"p{i:02d}.jpg"), part_image(i, 160, 120, defect=bad))
        rec: dict[str, Any] = {"id": f"p{i:02d}", "image": f"p{i:02d}.jpg",
                               "regions": {"left": {"defect": bad}, "right": {"defect": False}}}
        if i != 0:
            rec["defect"] = bad
        lines.append(json.dumps(rec))
    lines.append(json.dumps({"id": "typo", "image": "p01.jpg", "defect": False,
                             "regions": {"left": {"defect": "maybe"}}}))
    (folder / "labels.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "labels.jsonl"


def test_eval_under_a_program_reports_escape_and_false_reject_per_region(
        demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    labels = write_set(tmp_path / "ds", 12)
    config = tmp_path / "edge.yaml"
    config.write_text(PROGRAM_YAML.format(model=demo_dir, data=tmp_path / "data"))
    out = tmp_path / "out"
    code = main(["eval", str(labels), "--config", str(config), "--program", "halves", "--out", str(out), "--json",
                 "--quiet"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["dataset"]["samples"] == 12 and summary["dataset"]["issue_counts"] == {"bad_label": 1}
    assert "region 'left'" in stderr  # the typo's line names the region
    (variant,) = summary["variants"]
    # Count by hand from the run's own records and the labels: each region by its own verdict.
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 12 and all([r["name"] for r in run["regions"]] == ["left", "right"] for run in runs
                                   if "regions" in run)
    judged = [run for run in runs if "regions" in run]
    assert judged  # random weights: a frame whose regions are all OK and one without a verdict fails
    for name in ("left", "right"):
        bad = [(i, run) for run in judged for i in [int(run["id"][1:])] if name == "left" and i % 3 == 2]
        good = [(i, run) for run in judged for i in [int(run["id"][1:])] if not (name == "left" and i % 3 == 2)]
        said = {run["id"]: next(r for r in run["regions"] if r["name"] == name) for run in judged}
        escapes = sum(1 for _, run in bad if said[run["id"]]["verdict"]["defect"] is False)
        rejects = sum(1 for _, run in good if said[run["id"]]["verdict"]["defect"] is True)
        got = variant["regions"][name]
        assert (got["escape"]["count"], got["escape"]["of"]) == (escapes, len(bad)), name
        assert (got["false_reject"]["count"], got["false_reject"]["of"]) == (rejects, len(good)), name
        assert got["no_verdict"] == 12 - len(judged)
    # The overall is measured as before, on the 11 images that label the whole part.
    assert variant["escape"]["of"] + variant["false_reject"]["of"] <= 11
    report = json.loads((out / "report.json").read_text())
    assert report["variants"][0]["regions"]["left"]["escape_ids"] == [
        f"{run['id']}#left" for _, run in [(i, r) for r in judged for i in [int(r["id"][1:])] if i % 3 == 2]
        if next(x for x in run["regions"] if x["name"] == "left")["verdict"]["defect"] is False]

    page = (out / "report.html").read_text()
    assert "<h3>Regions</h3>" in page and "<td>left</td>" in page and "<td>right</td>" in page
    # The text report has a line per region; a rerun reuses every record of the same program.
    code = main(["eval", str(labels), "--config", str(config), "--program", "halves", "--out", str(out), "--quiet"])
    text = capsys.readouterr().out
    assert code == 0 and "  region left: escape " in text and "  region right: escape " in text
    assert "this run" not in text  # nothing inspected again
    # Another box is another variant: its records are not the old program's.
    config.write_text(PROGRAM_YAML.replace("80, 0, 80, 120", "70, 0, 90, 120").format(model=demo_dir,
                                                                                        data=tmp_path / "data"))
    code = main(["eval", str(labels), "--config", str(config), "--program", "halves", "--out", str(out), "--quiet"])
    assert code == 0 and "this run: 12 images" in capsys.readouterr().out


@pytest.mark.parametrize(("program", "says"), [("nope", "--program 'nope': no such program"),
                                               ("clipped", "--program clipped: a clip asks about several frames")])
def test_a_program_eval_cannot_use_is_one_line_and_exit_2(program: str, says: str, demo_dir: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    labels = write_set(tmp_path / "ds", 2)
    config = tmp_path / "edge.yaml"
    config.write_text((PROGRAM_YAML + CLIP_YAML).format(model=demo_dir, data=tmp_path / "data"))
    code = main(["eval", str(labels), "--config", str(config), "--program", program, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("edge-runtime")]
    assert code == 2 and len(lines) == 1 and says in lines[0], err
