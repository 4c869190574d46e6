"""The gate's labelled threshold and `eval --gate` on a bank of an inspection program's regions (issue 42),
with the demo bundle's real encoder and language model: four screw regions of a generated part, a defect
drawn in one of them. A frame is judged as the daemon judges it in skip_ok: its worst region's score over
that region's threshold (regions.frame_ratios); the labelled threshold is one factor on every region's
held-out threshold, so the daemon sends every frame with one region over it to the language model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edge_runtime.cli.main import main
from edge_runtime.config import CameraConfig, Config, ImageLimits, ProgramConfig
from edge_runtime.config.gate import GateConfig
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.evaluation.gate_fit import FitOptions, FitReport, fit_gate
from edge_runtime.inference.anomaly.bank import read_headers
from edge_runtime.inference.anomaly.loading import load_gates
from edge_runtime.inference.anomaly.step import GateStep
from edge_runtime.inference.inspector import Inspector
from tests.support.parts import clean_part

OK = {"defect": False, "category": "none", "confidence": 1, "notes": "surface clean"}
# A 64 px region around each corner screw hole of the 224 x 224 part (tests/support/parts.py)
CENTRES = {"tl": (46, 49), "tr": (176, 49), "bl": (46, 173), "br": (176, 173)}
SCREWS = {"regions": [{"name": n, "box": [x - 32, y - 32, 64, 64]} for n, (x, y) in CENTRES.items()]}
PROGRAM_YAML = "programs:\n  screws:\n    regions:\n" + "".join(
    f"      - {{name: {r['name']}, box: {r['box']}}}\n" for r in SCREWS["regions"]) + \
    "cameras:\n  - {name: belt, source: /dev/null, program: screws}\n"


def stained(seed: int, region: str, radius: int = 8) -> np.ndarray:
    """A good part with a dark stain (16 px across by default) beside the screw hole of `region`."""
    img = clean_part(seed).copy()
    cx, cy = CENTRES[region]
    cv2.circle(img, (cx + 14, cy + 10), radius, (25, 30, 35), -1)
    return img


def labelled_set(folder: Path, good: int, bad: int, seed: int) -> Path:
    """`good` clean parts and `bad` parts stained in one region each (the regions in turn), as labels.jsonl."""
    folder.mkdir()
    lines = []
    for s in range(good):
        cv2.imwrite(str(folder / f"g{s}.png"), clean_part(seed + s))
        lines.append(json.dumps({"image": f"g{s}.png", "defect": False}))
    for s in range(bad):
        cv2.imwrite(str(folder / f"b{s}-{list(CENTRES)[s % 4]}.png"), stained(seed + 500 + s, list(CENTRES)[s % 4]))
        lines.append(json.dumps({"image": f"b{s}-{list(CENTRES)[s % 4]}.png", "defect": True}))
    (folder / "labels.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "labels.jsonl"


def belt(gate: GateConfig | None = None) -> CameraConfig:
    return CameraConfig(name="belt", source="/tmp", kind="folder", program="screws", gate=gate)


@pytest.fixture(scope="module")
def fitted(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[FitReport, Path]:
    """`gate fit OK OUT --camera belt --labelled LABELS --max-escape 10%` on 30 good parts (6 held out) and
    36 labelled ones (30 stained in one region each: enough for a 10% claim at 95%)."""
    tmp = tmp_path_factory.mktemp("gate-screws")
    ok = tmp / "ok"
    ok.mkdir()
    for s in range(30):
        cv2.imwrite(str(ok / f"part-{s:02d}.png"), clean_part(s))
    labels = labelled_set(tmp / "labelled", 6, 30, 900)
    cfg = Config(device_id="t", programs={"screws": ProgramConfig.model_validate(SCREWS)}, cameras=[belt()])
    cfg.model.threads = 2
    out = tmp / "screws.bank"
    report = fit_gate(cfg, FitOptions(images=ok, out=out, model=str(demo_dir), camera="belt", progress=False,
                                      labelled=labels, max_escape=0.1))
    return report, labels


@pytest.fixture(scope="module")
def daemon_gate(demo_bundle: Bundle, config: Config, fitted: tuple[FitReport, Path]) -> Iterator[
        tuple[Inspector, GateStep]]:
    """The daemon's gate (GateStep) on the written bank, in annotate: each frame's look as skip_ok judges it."""
    settings = config.model.model_copy(update={"warmup": False, "encoder_cache_mb": 0})
    ins = Inspector(demo_bundle, settings, config.device_id)
    program = ProgramConfig.model_validate(SCREWS)
    ins.use_programs({"screws": program}, [belt()], ImageLimits())
    step = GateStep()
    gate = GateConfig(mode="annotate", bank=str(fitted[0].out), verdict=OK)
    step.install(load_gates(ins.bundle, ins.settings, [belt(gate)], {"belt": "defect"}, programs={"belt": program}))
    yield ins, step
    ins.close()


def read(path: Path) -> np.ndarray:
    image = cv2.imread(str(path))
    assert image is not None, path
    return image


def daemon_look(ins: Inspector, step: GateStep, frame: np.ndarray) -> dict[str, Any]:
    request = InspectionRequest(image=frame, camera="belt")
    step.sift([(request, ins.encode_frame("belt", frame))], ins, None, lambda _r, res: res,
              lambda _r, exc: pytest.fail(str(exc)))
    result = step.annotate(request, Result(device="t", camera="belt", frame=FrameInfo(0, 224, 224),
                                           verdict=dict(OK), text="", model="m", timings_ms={}, prompt="p"))
    assert result.gate is not None
    return result.gate


def test_the_labelled_threshold_of_a_program_is_one_factor_on_every_regions_held_out_threshold(
        fitted: tuple[FitReport, Path]) -> None:
    report, _ = fitted
    found = report.labelled["threshold"] if report.labelled else {}
    assert found["supported"] and found["escapes"] == 0 and found["bad_parts"] == 30
    factor = found["value"]
    assert factor == min(report.labelled["bad"]) if report.labelled else False
    headers = read_headers(report.out)
    assert [h.part.name for h in headers if h.part] == list(CENTRES)
    for h in headers:
        assert h.threshold.supported and h.threshold.target_escape == pytest.approx(0.1)
        assert h.threshold.value == pytest.approx(factor * h.fit["held_out"]["max"])
        assert h.fit["labelled"]["bad"] == 30 and "worst region" in h.fit["labelled"]["score"]


def test_a_labelled_frames_score_is_its_worst_regions_ratio_as_the_daemon_judges_it(
        fitted: tuple[FitReport, Path], daemon_gate: tuple[Inspector, GateStep]) -> None:
    """Fit's score of each labelled frame equals the daemon's (worst region's score over its threshold),
    scaled by the factor: the max over the regions, each against its own section."""
    report, labels = fitted
    assert report.labelled is not None
    factor = report.labelled["threshold"]["value"]
    by_id = {Path(i).stem: sc for i, _, sc in report.labelled["ids"]}
    for line in labels.read_text().splitlines():
        name = json.loads(line)["image"]
        look = daemon_look(*daemon_gate, read(labels.parent / name))
        assert by_id[Path(name).stem] == pytest.approx(factor * look["score"] / look["threshold"], rel=1e-4), name


@pytest.mark.parametrize("region", list(CENTRES))
def test_a_defect_drawn_in_one_region_is_caught_by_the_labelled_threshold(
        daemon_gate: tuple[Inspector, GateStep], region: str) -> None:
    """A stain of 20 px in any one region (the labelled ones were 16 px: the threshold is their lowest
    score, so a new one of that size may fall either side of it; the claim is a rate, 10% at 95%)."""
    look = daemon_look(*daemon_gate, stained(3000 + ord(region[0]) + ord(region[1]), region, radius=10))
    assert look["gated"] is False  # skip_ok sends it to the language model
    over = {r["name"] for r in look["regions"] if not r["gated"]}
    assert over == {region}, look["regions"]


def test_a_clean_part_is_gated_by_the_labelled_threshold(daemon_gate: tuple[Inspector, GateStep]) -> None:
    looks = [daemon_look(*daemon_gate, clean_part(4000 + s)) for s in range(4)]
    assert all(lk["gated"] for lk in looks), [lk["regions"] for lk in looks]


def test_eval_scores_a_programs_frame_by_its_worst_region_and_reports_escapes_and_calls_saved(
        fitted: tuple[FitReport, Path], daemon_gate: tuple[Inspector, GateStep], demo_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """eval's score of each frame is the daemon's (its worst region's score over that region's threshold),
    so its escapes are the stained parts skip_ok would answer OK, and its calls saved the parts it would."""
    report, _ = fitted
    labels = labelled_set(tmp_path / "set", 4, 8, 7000)
    config = tmp_path / "c.yaml"
    config.write_text(PROGRAM_YAML)
    out = tmp_path / "eval"
    assert main(["eval", str(labels), "--model", str(demo_dir), "--config", str(config), "--program", "screws",
                 "--gate", str(report.out), "--out", str(out), "--quiet", "--data-dir", str(tmp_path)]) == 0
    assert "the worst region's score / its threshold" in capsys.readouterr().out
    gate = json.loads((out / "report.json").read_text())["gate"]
    assert gate["threshold"] == 1.0 and gate["scored"] == 12 and [r["name"] for r in gate["regions"]] == list(CENTRES)
    daemon = {}
    for line in labels.read_text().splitlines():
        name = json.loads(line)["image"]
        look = daemon_look(*daemon_gate, read(labels.parent / name))
        daemon[Path(name).stem] = (look["score"] / look["threshold"], look["gated"])
    scores = sorted(gate["scores"]["bad"] + gate["scores"]["good"])
    assert scores == pytest.approx(sorted(ratio for ratio, _ in daemon.values()), rel=1e-4)
    escapes = sorted(Path(i).stem for i in gate["escape_ids"])
    assert escapes == sorted(k for k, (_, gated) in daemon.items() if gated and k.startswith("b"))
    assert gate["escape"]["of"] == 8 and gate["escape"]["count"] <= 1, gate["scores"]  # the stains are caught
    assert gate["calls_saved"]["count"] == sum(gated for _, gated in daemon.values())
    assert gate["false_reject"]["count"] == 0 and gate["false_reject"]["of"] == 4  # the clean parts gated
    # Each stained part's worst region is the one the stain is in.
    worst = {Path(i).stem: r for i, r in gate["worst_region"].items()}
    assert all(worst[f"b{s}-{list(CENTRES)[s % 4]}"] == list(CENTRES)[s % 4] for s in range(8))


def test_eval_of_a_programs_bank_without_the_program_is_one_line_before_any_model_loads(
        fitted: tuple[FitReport, Path], demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    labels = labelled_set(tmp_path / "set", 1, 0, 7000)
    code = main(["eval", str(labels), "--model", str(demo_dir), "--gate", str(fitted[0].out), "--out",
                 str(tmp_path / "o"), "--quiet", "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "holds the regions tl, tr, bl, br of an inspection program: give --program" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_gate_fit_labelled_on_a_cameras_regions_says_the_threshold_is_a_factor(
        demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ok = tmp_path / "ok"
    ok.mkdir()
    for s in range(12):
        cv2.imwrite(str(ok / f"p{s}.png"), clean_part(s))
    labels = labelled_set(tmp_path / "set", 2, 4, 8000)
    config = tmp_path / "c.yaml"
    config.write_text(PROGRAM_YAML)
    out = tmp_path / "s.bank"
    assert main(["gate", "fit", str(ok), str(out), "--camera", "belt", "--labelled", str(labels), "--max-escape",
                 "10%", "--model", str(demo_dir), "--config", str(config), "--quiet", "--data-dir",
                 str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "threshold each region's held-out largest score x" in text and "NOT an escape claim" in text
    assert "4 defective parts bound it at" in text
    assert all(not h.threshold.supported for h in read_headers(out))


def test_the_regions_thresholds_gate_exactly_the_labelled_frames_the_claim_counted_as_gated() -> None:
    """The labelled threshold of a program is chosen on frame ratios (score / unit) and written as factor x
    unit per region; the daemon then compares score / (factor x unit) with 1. The defective frame whose
    ratio is the threshold is counted as not gated (an escape needs a score under it): the written
    thresholds must not gate it through rounding (0.7 / 0.3 x 0.3 is 0.7000000000000001 > 0.7)."""
    from edge_runtime.evaluation.gate_fit import _threshold
    from edge_runtime.evaluation.gate_threshold import choose_threshold
    from edge_runtime.inference.anomaly.regions import frame_ratios

    rng = np.random.default_rng(11)
    for _ in range(300):
        units = [float(u) for u in rng.uniform(0.05, 2.0, 3)]  # each region's held-out largest score
        bad = [[float(s) for s in row] for row in rng.uniform(0.0, 3.0, (5, 3))]
        good = [[float(s) for s in row] for row in rng.uniform(0.0, 1.0, (5, 3))]

        def worst(scores: list[float], limits: list[float]) -> float:
            ratios, at = frame_ratios(scores, limits)
            return ratios[at]

        found = choose_threshold([worst(s, units) for s in good], [worst(s, units) for s in bad], 0.5)
        chosen = [_threshold({"max": u, "images": 8}, found, u).value for u in units]
        limits = [v for v in chosen if v is not None]
        assert len(limits) == len(units)
        gated_bad = sum(1 for s in bad if worst(s, limits) < 1)
        assert gated_bad == found["escapes"], (units, bad, found["value"], limits)
