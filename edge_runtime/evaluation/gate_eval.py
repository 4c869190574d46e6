"""`eval --gate BANK`: the gate measured on the labelled set beside the language model.

Each image is read and encoded once more for the gate (the encoder is a small part of a verdict's
time) and scored against the bank. Under `--program` with regions (a bank of `gate fit --camera` on
such a program: one section per region) each region's crop is scored against its own section and the
frame's score is its worst region's score over that region's threshold, the daemon's rule in skip_ok
(regions.frame_ratios): the threshold is then 1, and `--gate-threshold` a factor on every region's.
The report gives the gate's escape and false-reject rates at the
threshold (Wilson 95% intervals) and over a range of thresholds (the curve in report.html), the share
of language-model calls `skip_ok` would save, and what `skip_ok` would have done on this set with the
first variant's verdicts: a gated part is an OK, every other part gets the language model's verdict
(a program's part sent on: the gate's OK for its regions under their threshold, the model's for the rest).
A part whose encoding or score is not a finite number (a broken encoder) is never gated, as in the
daemon (inference/anomaly/step.py sends such a frame to the language model): it counts as flagged,
is counted in `not_finite` (one line in the report) and is left out of the score lists and the curve.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.config.programs import ProgramConfig
from edge_runtime.config.schema import ImageLimits
from edge_runtime.core.errors import EdgeRuntimeError, ImageError
from edge_runtime.core.images import read_image_file
from edge_runtime.evaluation.defect import DefectRule
from edge_runtime.evaluation.gate_fit import cut
from edge_runtime.evaluation.gate_threshold import curve
from edge_runtime.evaluation.metrics import Pair, rate
from edge_runtime.evaluation.runner import EVAL_CAMERA, Progress
from edge_runtime.inference.anomaly.bank import BankError, read_header, read_headers
from edge_runtime.inference.anomaly.features import gate_context
from edge_runtime.inference.anomaly.gate import AnomalyGate
from edge_runtime.inference.anomaly.regions import (
    RegionGate,
    frame_ratios,
    has_regions,
    load_region_gates,
    program_budget,
    score_regions,
)
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.regions import RegionsEncoded

MAX_BANK_BYTES = 4 << 30  # eval runs beside nothing else: a bank up to 4 GiB is measured


def check_bank(path: Path, program: str | None = None, regions: bool = False) -> None:
    """Fail before any model loads when the file is not a bank, or a bank of a program's regions is
    measured without that program (`--program`), or a whole-frame bank with a program of regions (one line)."""
    headers = read_headers(path)
    if headers[0].part is not None and not regions:
        names = ", ".join(h.part.name for h in headers if h.part is not None)
        raise EdgeRuntimeError(f"--gate {path}: the bank holds the regions {names} of an inspection program: give "
                               "--program NAME, the program it was fitted for (gate fit --camera)"
                               + (f"; program {program} has no regions" if program else ""))
    if headers[0].part is None and regions:
        raise EdgeRuntimeError(f"--gate {path}: the bank holds whole frames, but program {program} cuts each image "
                               "into regions: fit the gate for that program (gate fit --camera NAME)")


class _Scorer:
    """A frame's gate score as the daemon judges it: a whole frame's score, or a program's frame's worst
    region's score over that region's threshold (regions.frame_ratios)."""

    def __init__(self, inspector: Inspector, bank: Path, program: ProgramConfig | None) -> None:
        self.inspector = inspector
        header = read_header(bank)
        self.region = header.region
        context = gate_context(inspector.bundle, inspector.settings, header.region, budget=program_budget(program))
        self.program = program is not None
        self.regions: list[RegionGate] = []
        if program is not None and has_regions(program):
            for g in load_region_gates(str(bank), context, program, None, MAX_BANK_BYTES):
                assert g.context.part is not None
                if g.threshold is None:
                    raise EdgeRuntimeError(f"--gate {bank}: region {g.context.part[0]} has no threshold: fit again")
                self.regions.append(RegionGate(g.context.part[0], g.context.part[1], g, g.threshold))
            self.gate = self.regions[0].gate
        else:
            self.gate = AnomalyGate.load(bank, context, MAX_BANK_BYTES)

    def score(self, frame: np.ndarray) -> tuple[float, str | None, dict[str, float] | None]:
        """(the frame's score, its worst region's name and each region's ratio; None, None for a whole
        frame). NaN when the encoder's output is not all finite numbers: faiss would turn it into a huge
        finite distance, not an error."""
        enc = self.inspector.encode_frame(EVAL_CAMERA, frame) if self.program else self.inspector.encode(frame)
        crops = [e for _, e in enc.regions if not isinstance(e, Exception)] if isinstance(enc, RegionsEncoded) \
            else [enc]
        if not all(np.isfinite(e.embeds).all() for e in crops):
            return math.nan, None, None
        if not self.regions:
            return self.gate.score(enc).score, None, None
        scores = score_regions(self.regions, enc)
        ratios, worst = frame_ratios([sc.score for sc in scores], [r.threshold for r in self.regions])
        return ratios[worst], self.regions[worst].name, {r.name: x for r, x in zip(self.regions, ratios, strict=True)}


def gate_section(inspector: Inspector, bank: Path, threshold: float | None, pairs: list[Pair],
                 rule: DefectRule, limits: ImageLimits, progress: bool = True,
                 program: ProgramConfig | None = None) -> dict[str, Any]:
    """The report's `gate` object for `bank` on the samples of `pairs` (the first variant's); `program`:
    the images were inspected under it (eval --program), and so are they encoded and scored."""
    header = read_header(bank)
    scorer = _Scorer(inspector, bank, program)
    # A program's regions: scores are ratios to each region's own threshold, so the frame's is 1.
    th = threshold if threshold is not None else 1.0 if scorer.regions else scorer.gate.threshold
    if th is None:
        raise EdgeRuntimeError(f"--gate {bank}: the bank has no threshold; give --gate-threshold")
    rows: list[dict[str, Any]] = []
    left_out: Counter[str] = Counter()
    not_finite = 0  # parts whose score is not a finite number: never gated (they go to the language model)
    issues: list[str] = []
    bar = Progress("gate", len(pairs), progress)
    for p in pairs:
        bar.update(1)
        truth = rule.holds(p.sample.expected)
        if truth is None:
            left_out["unknown_label"] += 1
            continue
        try:
            frame = cut(read_image_file(p.sample.image, limits.max_pixels, limits.min_side,
                                        int(limits.max_file_mb * 2**20)), header.region, p.sample.image)
            score, worst, ratios = scorer.score(frame)
        except (ImageError, BankError, EdgeRuntimeError) as exc:  # one record, one line: the run goes on
            left_out["gate_refused"] += 1
            issues.append(f"gate: {p.sample.id}: {str(exc)[:300]}")
            continue
        finite = math.isfinite(score)
        not_finite += not finite
        vlm = rule.holds(p.verdict) if p.verdict is not None else None
        rows.append({"id": p.sample.id, "bad": truth, "score": score if finite else None, "vlm_defect": vlm,
                     **({"region": worst, "ratios": ratios, "region_defects": _region_defects(p, rule)}
                        if worst is not None and finite else {})})
    regions = {"score_unit": "the worst region's score / its threshold",
               "regions": [{"name": r.name, "box": list(r.box), "threshold": r.threshold} for r in scorer.regions],
               "worst_region": {r["id"]: r["region"] for r in rows if "region" in r}} if scorer.regions else {}
    return {"bank": str(bank), "sha256": header.vectors.sha256, "encoder": header.encoder.model_dump(),
            "threshold": th, "threshold_source": "--gate-threshold" if threshold is not None else "bank",
            "bank_threshold": header.threshold.model_dump(), "scored": len(rows), "left_out": dict(left_out),
            "not_finite": not_finite, "issues": issues[:1000], **regions, **measure(rows, th)}


def measure(rows: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """Rates at `threshold`, the curve, and skip_ok's outcome with the language model's verdicts. A row
    whose score is None (not a finite number) is never gated, and is in neither score list nor the curve."""
    def is_gated(r: dict[str, Any]) -> bool:
        return r["score"] is not None and r["score"] < threshold

    good = [r["score"] for r in rows if not r["bad"] and r["score"] is not None]
    bad = [r["score"] for r in rows if r["bad"] and r["score"] is not None]
    gated = [r for r in rows if is_gated(r)]
    escapes = [r["id"] for r in gated if r["bad"]]
    flagged_good = [r["id"] for r in rows if not r["bad"] and not is_gated(r)]
    def skip_ok_defect(r: dict[str, Any]) -> bool | None:
        """skip_ok's decision: a gated part is an OK without the language model; a program's frame sent on
        takes the gate's OK for its regions under their threshold and the model's verdict for the others
        (None: one of those has none and none is NOK: no verdict, never an OK); the rest the model's."""
        if is_gated(r):
            return False
        if r.get("ratios") is None or r.get("region_defects") is None:
            return bool(r["vlm_defect"])
        asked = [r["region_defects"].get(n) for n, x in r["ratios"].items() if not x < threshold]
        return True if True in asked else None if None in asked else False

    judged = [r for r in rows if r["vlm_defect"] is not None]
    sys_escape = sum(1 for r in judged if r["bad"] and skip_ok_defect(r) is False)
    sys_reject = sum(1 for r in judged if not r["bad"] and skip_ok_defect(r) is True)
    vlm_escape = sum(1 for r in judged if r["bad"] and not r["vlm_defect"])
    vlm_reject = sum(1 for r in judged if not r["bad"] and r["vlm_defect"])
    n_bad, n_good = sum(1 for r in judged if r["bad"]), sum(1 for r in judged if not r["bad"])
    return {
        "escape": rate(len(escapes), sum(1 for r in rows if r["bad"])),
        "false_reject": rate(len(flagged_good), sum(1 for r in rows if not r["bad"])),
        "calls_saved": rate(len(gated), len(rows)), "escape_ids": escapes, "false_reject_ids": flagged_good,
        "skip_ok": {"judged": len(judged), "escape": rate(sys_escape, n_bad),
                    "false_reject": rate(sys_reject, n_good),
                    "language_model_alone": {"escape": rate(vlm_escape, n_bad),
                                             "false_reject": rate(vlm_reject, n_good)}},
        "scores": {"good": good, "bad": bad}, "curve": curve(good, bad),
    }


def _region_defects(p: Pair, rule: DefectRule) -> dict[str, bool | None] | None:
    """Each region's defect decision by the model on this part (None where the region has no verdict);
    None when the run kept no regions for it."""
    regions = p.record.get("regions")
    if not isinstance(regions, list):
        return None
    return {str(r.get("name")): rule.holds(r["verdict"]) if r.get("outcome") != "none" and isinstance(
        r.get("verdict"), dict) else None for r in regions if isinstance(r, dict)}
