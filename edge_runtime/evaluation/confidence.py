"""Confidence: the reliability diagram, and the `min_confidence` that holds escapes under a target.

The policy measured: a verdict that passes a part with a confidence under the threshold is not
trusted; the part goes to review (a rule with the `review` action). Escapes left at threshold t are
the bad parts passed with confidence >= t; the cost is the good parts held for review.
"""

from __future__ import annotations

import json
from typing import Any

from edge_runtime.evaluation.defect import DefectRule
from edge_runtime.evaluation.metrics import Pair, rate
from edge_runtime.verdicts.rules import lookup

BINS = 10


def _confidence(verdict: dict[str, Any], field: str) -> float | None:
    value = lookup({"verdict": verdict}, field)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1:
        return float(value)
    return None


def decisions(pairs: list[Pair], rule: DefectRule, field: str) -> list[tuple[bool, bool, float]]:
    """(truth, predicted, confidence) for every pair the defect rule and the confidence can judge."""
    out = []
    for p in pairs:
        if p.verdict is None:
            continue
        truth, pred, conf = rule.holds(p.sample.expected), rule.holds(p.verdict), _confidence(p.verdict, field)
        if truth is not None and pred is not None and conf is not None:
            out.append((truth, pred, conf))
    return out


def reliability(rows: list[tuple[bool, bool, float]]) -> dict[str, Any]:
    """Per confidence bin: count, mean confidence, share of correct defect decisions; and the ECE."""
    bins: list[dict[str, Any]] = []
    ece = 0.0
    for b in range(BINS):
        lo, hi = b / BINS, (b + 1) / BINS
        inside = [(t == p, c) for t, p, c in rows if lo <= c < hi or (b == BINS - 1 and c == 1.0)]
        if not inside:
            bins.append({"lo": lo, "hi": hi, "count": 0, "confidence": None, "accuracy": None})
            continue
        conf = sum(c for _, c in inside) / len(inside)
        acc = sum(1 for ok, _ in inside if ok) / len(inside)
        ece += len(inside) / len(rows) * abs(acc - conf)
        bins.append({"lo": lo, "hi": hi, "count": len(inside), "confidence": conf, "accuracy": acc})
    return {"bins": bins, "ece": ece if rows else None, "n": len(rows)}


def threshold_for(rows: list[tuple[bool, bool, float]], target: float) -> dict[str, Any]:
    """The lowest min_confidence whose escape rate (bad parts passed at >= it) is at most `target`."""
    bad = sum(1 for t, _, _ in rows if t)
    good = len(rows) - bad
    passed_bad = sorted(c for t, p, c in rows if t and not p)
    candidates = sorted({0.0, *(round(c + 1e-6, 6) for c in passed_bad)})
    for th in candidates:
        if th > 1.0:
            break  # a bad part passed with confidence 1: no threshold can hold it
        escapes = sum(1 for c in passed_bad if c >= th)
        if (bad and escapes / bad <= target) or not bad:
            held = sum(1 for t, p, c in rows if not t and not p and c < th)
            return {"target": target, "min_confidence": th, "reachable": True,
                    "escape": rate(escapes, bad), "good_held_for_review": rate(held, good)}
    return {"target": target, "min_confidence": None, "reachable": False,
            "escape": rate(len(passed_bad), bad), "good_held_for_review": rate(0, good)}


def rule_snippet(found: dict[str, Any], rule: DefectRule, field: str) -> str | None:
    """A rules: entry for the config (YAML) that sends low-confidence passes to review."""
    th = found.get("min_confidence")
    if th is None or th <= 0:
        return None
    lines = ["rules:", "  - name: low-confidence-pass", "    when:"]
    passed = rule.pass_condition()
    if passed is not None:
        lines.append(f"      - {{field: {passed['field']}, equals: {json.dumps(passed['equals'])}}}")
    lines.append(f"      - {{field: {field}, lt: {th:.4g}}}")
    lines.append("    actions:")
    lines.append("      - {type: review}")
    if passed is None:
        lines.insert(1, f"# add the condition of a passed part (the opposite of: {rule.text})")
    return "\n".join(lines) + "\n"
