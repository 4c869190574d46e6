"""`edge-runtime eval` on the demo bundle: the real inspection path, reports, comparison, resume."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.cli.main import main
from tests.evaluation.conftest import write_labelled_set
from tests.support.images import png_bomb

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = '<img src=x onerror=alert(1)>'


def run_eval(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["eval", *args, "--quiet"])
    out, err = capsys.readouterr()
    return code, out, err


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def test_eval_on_the_demo_bundle_counts_each_bad_case_and_writes_both_reports(
        demo_dir: Path, labelled_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = tmp_path / "ds"
    shutil.copytree(labelled_set.parent, ds)
    (ds / "bomb.png").write_bytes(png_bomb(30000, 30000))
    extra = [{"id": "bomb", "image": "bomb.png", "defect": True},
             {"id": "gone", "image": "gone.jpg", "defect": True},
             {"id": HOSTILE, "image": "part000.jpg", "defect": "</code><script>alert(2)</script>"},
             {"id": "part001", "image": "part001.jpg", "defect": True}]
    with (ds / "labels.jsonl").open("a") as f:
        f.write("".join(json.dumps(x) + "\n" for x in extra))
    out = tmp_path / "out"
    code, stdout, stderr = run_eval(capsys, str(ds / "labels.jsonl"), "--model", str(demo_dir), "--out", str(out),
                                    "--data-dir", str(tmp_path / "data"), "--json")
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert json.loads((out / "summary.json").read_text()) == summary
    assert summary["dataset"]["samples"] == 25  # 24 + the bomb (refused when read, not when listed)
    assert summary["dataset"]["issue_counts"] == {"missing_image": 1, "bad_label": 1, "duplicate_id": 1,
                                                  "bad_image": 1}
    assert [line for line in stderr.splitlines() if line.startswith("eval: left out")] and "Traceback" not in stderr
    (v,) = summary["variants"]
    assert v["errors"] == {"bad_image": 1}
    assert v["escape"]["of"] + v["false_reject"]["of"] == 24  # 8 bad and 16 good parts were judged
    assert v["escape"]["of"] == 8 and v["latency_ms"]["p50"] > 0 and v["tokens_per_verdict"] > 5
    report = json.loads((out / "report.json").read_text())
    d = report["variants"][0]["defect"]
    assert len(d["escape_ids"]) == d["fn"] and len(d["false_reject_ids"]) == d["fp"]
    assert set(report["variants"][0]["fields"]) == {"defect", "category"}
    assert any("30000x30000" in line for line in report["dataset"]["issues"])
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page
    assert HOSTILE not in page and "<script>" not in page and "&lt;img src=x" in page
    assert page.count("<figure>") == d["fn"] + d["fp"]  # a thumbnail for every escape and false reject
    assert len(records(out)) == 25


def test_two_bundles_and_two_prompts_are_compared_on_the_same_images(
        demo_dir: Path, other_bundle: Path, labelled_set: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# two questions\nIs the part defective?\nLook for scratches on the part.\n")
    out = tmp_path / "out"
    code, stdout, stderr = run_eval(capsys, str(labelled_set), "--model", str(demo_dir), "--model", str(other_bundle),
                                    "--prompts", str(prompts), "--out", str(out), "--limit", "6",
                                    "--data-dir", str(tmp_path / "data"), "--json")
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert [v["prompt"] for v in summary["variants"]] == ["Is the part defective?",
                                                          "Look for scratches on the part."] * 2
    assert len(summary["comparisons"]) == 3
    for c in summary["comparisons"]:
        assert c["paired"] == 6 and c["escape"]["of"] == 2 and c["false_reject"]["of"] == 4
        assert 0 <= c["escape"]["p_value"] <= 1
    keys = {r["key"] for r in records(out)}
    assert len(keys) == 4 and len(records(out)) == 24
    verdicts = {r["key"]: [x["verdict"] for x in records(out) if x["key"] == r["key"]] for r in records(out)}
    assert len({json.dumps(v) for v in verdicts.values()}) > 1  # the variants really differ


def test_an_interrupted_run_continues_without_redoing_finished_images(
        demo_dir: Path, tmp_path: Path) -> None:
    labels = write_labelled_set(tmp_path / "ds", 36, size=(96, 72))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "edge_runtime", "eval", str(labels), "--model", str(demo_dir), "--out", str(out),
           "--data-dir", str(tmp_path / "data"), "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    runs = out / "runs.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if runs.exists() and runs.read_text().count("\n") >= 8:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    before = records(out)
    assert 8 <= len(before) < 36, "the run was not cut in the middle"
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    after = records(out)
    assert after[:len(before)] == before  # the earlier records kept as they were
    assert sorted(r["id"] for r in after) == [f"part{i:03d}" for i in range(36)]  # each image exactly once
    report = json.loads((out / "report.json").read_text())
    run = report["variants"][0]["run"]
    assert run["reused"] == len(before) and run["inspected_now"] == 36 - len(before)


def test_the_same_bundle_twice_is_measured_once(demo_dir: Path, labelled_set: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = run_eval(capsys, str(labelled_set), "--model", str(demo_dir), "--model", str(demo_dir),
                                    "--out", str(tmp_path / "out"), "--limit", "3",
                                    "--data-dir", str(tmp_path / "data"), "--json")
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert len(summary["variants"]) == 1 and summary["comparisons"] == []
    assert "measured already; skipped" in stderr
