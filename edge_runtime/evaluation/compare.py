"""Side by side: two variants on the same images, paired, with McNemar's exact test.

For each pair of variants (the first against each other one) and each outcome (escape on the bad
parts, false reject on the good parts, a wrong defect decision on all), the discordant pairs are
counted: b = only the first variant had the outcome, c = only the other one. McNemar's exact test
is the two-sided binomial test of min(b, c) in b + c at 1/2 (scipy); p < 0.05 is called significant.
"""

from __future__ import annotations

from typing import Any

from scipy.stats import binomtest

from edge_runtime.evaluation.defect import DefectRule
from edge_runtime.evaluation.metrics import Pair

ALPHA = 0.05


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value of b and c discordant pairs (1.0 when there are none)."""
    if b + c == 0:
        return 1.0
    return float(binomtest(min(b, c), b + c, 0.5).pvalue)


def _outcomes(pairs: list[Pair], rule: DefectRule) -> dict[str, tuple[bool, bool]]:
    out: dict[str, tuple[bool, bool]] = {}
    for p in pairs:
        if p.verdict is None:
            continue
        truth, pred = rule.holds(p.sample.expected), rule.holds(p.verdict)
        if truth is not None and pred is not None:
            out[p.sample.id] = (truth, pred)
    return out


def compare(a: list[Pair], b: list[Pair], rule: DefectRule) -> dict[str, Any]:
    """Escape, false-reject and error differences of `b` against `a` on the images both judged."""
    oa, ob = _outcomes(a, rule), _outcomes(b, rule)
    common = sorted(set(oa) & set(ob))
    result: dict[str, Any] = {"paired": len(common)}
    tests = {
        "escape": lambda t, p: t and not p,          # only bad parts count
        "false_reject": lambda t, p: p and not t,    # only good parts count
        "wrong": lambda t, p: t != p,
    }
    for name, bad in tests.items():
        ids = [i for i in common if (name != "escape" or oa[i][0]) and (name != "false_reject" or not oa[i][0])]
        only_a = sum(1 for i in ids if bad(*oa[i]) and not bad(*ob[i]))
        only_b = sum(1 for i in ids if bad(*ob[i]) and not bad(*oa[i]))
        n_a = sum(1 for i in ids if bad(*oa[i]))
        n_b = sum(1 for i in ids if bad(*ob[i]))
        p = mcnemar_exact(only_a, only_b)
        result[name] = {"of": len(ids), "a": n_a, "b": n_b,
                        "rate_a": n_a / len(ids) if ids else None, "rate_b": n_b / len(ids) if ids else None,
                        "difference": (n_b - n_a) / len(ids) if ids else None,
                        "only_a": only_a, "only_b": only_b, "p_value": p, "significant": p < ALPHA}
    return result
