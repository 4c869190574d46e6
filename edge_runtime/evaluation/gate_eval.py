"""`eval --gate BANK`: the gate measured on the labelled set beside the language model.

Each image is read and encoded once more for the gate (the encoder is a small part of a verdict's
time) and scored against the bank. The report gives the gate's escape and false-reject rates at the
threshold (Wilson 95% intervals) and over a range of thresholds (the curve in report.html), the share
of language-model calls `skip_ok` would save, and what `skip_ok` would have done on this set with the
first variant's verdicts: a gated part is an OK, every other part gets the language model's verdict.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from edge_runtime.config.schema import ImageLimits
from edge_runtime.core.errors import EdgeRuntimeError, ImageError
from edge_runtime.core.images import read_image_file
from edge_runtime.evaluation.defect import DefectRule
from edge_runtime.evaluation.gate_fit import cut
from edge_runtime.evaluation.gate_threshold import curve
from edge_runtime.evaluation.metrics import Pair, rate
from edge_runtime.evaluation.runner import Progress
from edge_runtime.inference.anomaly.bank import BankError, read_header
from edge_runtime.inference.anomaly.features import gate_context
from edge_runtime.inference.anomaly.gate import AnomalyGate
from edge_runtime.inference.inspector import Inspector

MAX_BANK_BYTES = 4 << 30  # eval runs beside nothing else: a bank up to 4 GiB is measured


def check_bank(path: Path) -> None:
    """Fail before any model loads when the file is not a bank (one line)."""
    read_header(path)


def gate_section(inspector: Inspector, bank: Path, threshold: float | None, pairs: list[Pair],
                 rule: DefectRule, limits: ImageLimits, progress: bool = True) -> dict[str, Any]:
    """The report's `gate` object for `bank` on the samples of `pairs` (the first variant's)."""
    header = read_header(bank)
    context = gate_context(inspector.bundle, inspector.settings, header.region)
    gate = AnomalyGate.load(bank, context, MAX_BANK_BYTES)
    th = threshold if threshold is not None else gate.threshold
    if th is None:
        raise EdgeRuntimeError(f"--gate {bank}: the bank has no threshold; give --gate-threshold")
    rows: list[dict[str, Any]] = []
    left_out: Counter[str] = Counter()
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
            score = gate.score(inspector.encode(frame)).score
        except (ImageError, BankError, EdgeRuntimeError) as exc:  # one record, one line: the run goes on
            left_out["gate_refused"] += 1
            issues.append(f"gate: {p.sample.id}: {str(exc)[:300]}")
            continue
        vlm = rule.holds(p.verdict) if p.verdict is not None else None
        rows.append({"id": p.sample.id, "bad": truth, "score": score, "vlm_defect": vlm})
    return {"bank": str(bank), "sha256": header.vectors.sha256, "encoder": header.encoder.model_dump(),
            "threshold": th, "threshold_source": "--gate-threshold" if threshold is not None else "bank",
            "bank_threshold": header.threshold.model_dump(), "scored": len(rows), "left_out": dict(left_out),
            "issues": issues[:1000], **measure(rows, th)}


def measure(rows: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """Rates at `threshold`, the curve, and skip_ok's outcome with the language model's verdicts."""
    good = [r["score"] for r in rows if not r["bad"]]
    bad = [r["score"] for r in rows if r["bad"]]
    gated = [r for r in rows if r["score"] < threshold]
    escapes = [r["id"] for r in gated if r["bad"]]
    flagged_good = [r["id"] for r in rows if not r["bad"] and r["score"] >= threshold]
    judged = [r for r in rows if r["vlm_defect"] is not None]
    # skip_ok: a gated part is an OK without the language model; the rest keep its verdict.
    sys_escape = sum(1 for r in judged if r["bad"] and (r["score"] < threshold or not r["vlm_defect"]))
    sys_reject = sum(1 for r in judged if not r["bad"] and r["score"] >= threshold and r["vlm_defect"])
    vlm_escape = sum(1 for r in judged if r["bad"] and not r["vlm_defect"])
    vlm_reject = sum(1 for r in judged if not r["bad"] and r["vlm_defect"])
    n_bad, n_good = sum(1 for r in judged if r["bad"]), sum(1 for r in judged if not r["bad"])
    return {
        "escape": rate(len(escapes), len(bad)), "false_reject": rate(len(flagged_good), len(good)),
        "calls_saved": rate(len(gated), len(rows)), "escape_ids": escapes, "false_reject_ids": flagged_good,
        "skip_ok": {"judged": len(judged), "escape": rate(sys_escape, n_bad),
                    "false_reject": rate(sys_reject, n_good),
                    "language_model_alone": {"escape": rate(vlm_escape, n_bad),
                                             "false_reject": rate(vlm_reject, n_good)}},
        "scores": {"good": good, "bad": bad}, "curve": curve(good, bad),
    }
