"""The gate's threshold from labelled evidence, and its curve.

A part scoring under the threshold is gated: in `skip_ok` it is an OK result without the language
model. So the gate's **escape** is a bad part scoring under the threshold, and its **false reject** a
good part scoring at or over it (the gate flags it; in `skip_ok` it goes to the language model, which
may still pass it: a call not saved, not a part scrapped).

The threshold chosen for a target escape rate is the highest whose escape rate's upper one-sided 95%
Clopper-Pearson bound stays under the target: with k escapes in n bad parts the bound is the beta
quantile `beta.ppf(0.95, k + 1, n - k)`; with none it is 1 - 0.05^(1/n), about 3/n (the "rule of
three"), so a claim of 0.1% needs about 3,000 bad parts with none gated. With fewer the data cannot
support the claim, and the result says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scipy.stats import beta

from edge_runtime.evaluation.metrics import rate

CONFIDENCE = 0.95
CURVE_POINTS = 60


def escape_upper(k: int, n: int, confidence: float = CONFIDENCE) -> float:
    """Upper one-sided Clopper-Pearson bound of an escape rate of k in n (1.0 when n is 0 or k is n)."""
    if n <= 0 or k >= n:
        return 1.0
    return float(beta.ppf(confidence, k + 1, n - k))


def bad_parts_needed(target: float, confidence: float = CONFIDENCE) -> int:
    """The fewest bad parts, none of them gated, whose bound reaches `target` (0 < target < 1)."""
    if not 0 < target < 1:
        raise ValueError("a target escape rate is over 0 and under 1 (no finite set proves a rate of 0)")
    return math.ceil(math.log(1 - confidence) / math.log1p(-target))


def choose_threshold(good: Sequence[float], bad: Sequence[float], target: float) -> dict[str, Any]:
    """The highest threshold (most calls saved) whose escape bound stays under `target`.

    The candidates are the bad parts' own scores: at the k-th lowest, k bad parts score under it. When
    not even zero escapes can meet the target with this many bad parts, the threshold with none gated
    (the lowest bad score) is given, marked unsupported, with the count the claim would need."""
    bads = sorted(float(s) for s in bad)
    n = len(bads)
    needed = bad_parts_needed(target)
    out: dict[str, Any] = {"target_escape": target, "confidence": CONFIDENCE, "bad_parts": n,
                           "good_parts": len(good), "bad_parts_needed": needed}
    if n == 0:
        return {**out, "value": None, "supported": False,
                "note": f"no defective part in the labelled set: an escape rate under {target:.3%} needs at "
                        f"least {needed} defective parts with none gated"}
    best = None
    for k in range(n):
        if k and bads[k] == bads[k - 1]:
            continue  # a tie: this threshold gates the same parts as the one before
        if escape_upper(k, n) <= target:
            best = k
        else:
            break  # the bound grows with k: no higher threshold can meet the target
    supported = best is not None
    k = best if best is not None else 0
    value = bads[k]
    upper = escape_upper(k, n)
    gated_good = sum(1 for s in good if s < value)
    if supported:
        note = (f"escape under {target:.3%} at {CONFIDENCE:.0%} confidence: {k} of {n} defective parts score "
                f"under {value:.4g} (upper bound {upper:.3%})")
    else:
        note = (f"the labelled set cannot support an escape rate under {target:.3%}: {n} defective parts "
                f"bound it at {upper:.2%} even with none gated; the claim needs at least {needed} defective "
                f"parts with none gated. The threshold given gates none of these {n} (use annotate, not "
                "skip_ok, until the data supports it)")
    return {**out, "value": value, "supported": supported, "escapes": k, "escape_upper": upper,
            "escape": rate(k, n), "gated_good": rate(gated_good, len(good)), "note": note}


def curve(good: Sequence[float], bad: Sequence[float], points: int = CURVE_POINTS) -> list[dict[str, Any]]:
    """Escape and false-reject rates of the gate, and the share of parts it gates, at thresholds
    spread over the scores seen (every part's verdict is as many language-model calls saved)."""
    scores = sorted({float(s) for s in (*good, *bad)})
    if not scores:
        return []
    lo, hi = scores[0], scores[-1]
    steps = [lo + (hi - lo) * i / (points - 1) for i in range(points)] if hi > lo else [lo]
    total = len(good) + len(bad)
    out = []
    for t in sorted({*steps, hi * 1.0001}):
        escapes = sum(1 for s in bad if s < t)
        flagged_good = sum(1 for s in good if s >= t)
        gated = escapes + (len(good) - flagged_good)
        out.append({"threshold": t, "escape": escapes / len(bad) if bad else None,
                    "false_reject": flagged_good / len(good) if good else None,
                    "gated": gated / total if total else None})
    return out
