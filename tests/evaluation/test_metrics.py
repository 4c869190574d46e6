"""The metric code against numbers computed by hand (no model involved)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from edge_runtime.config.rules import Rule
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.evaluation.compare import compare, mcnemar_exact
from edge_runtime.evaluation.confidence import reliability, rule_snippet, threshold_for
from edge_runtime.evaluation.dataset import Sample
from edge_runtime.evaluation.defect import parse_defect, rule_defect
from edge_runtime.evaluation.metrics import Pair, defect_metrics, field_metrics, normalise, wilson

SCHEMA: dict[str, Any] = {"type": "object", "properties": {
    "defect": {"type": "boolean"},
    "category": {"type": "string", "enum": ["none", "scratch", "dent"]},
    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    "notes": {"type": "string"},
}}
RULE = parse_defect("verdict.defect == true")


def pair(sid: str, expected: dict[str, Any], verdict: dict[str, Any] | None) -> Pair:
    return Pair(Sample(sid, Path(f"/x/{sid}.jpg"), expected), verdict, {})


def line() -> list[Pair]:
    """10 bad parts (7 caught, 3 passed) and 20 good parts (2 rejected, 18 passed)."""
    pairs = []
    for i in range(10):
        pairs.append(pair(f"bad{i}", {"defect": True}, {"defect": i < 7, "confidence": 0.9}))
    for i in range(20):
        pairs.append(pair(f"good{i}", {"defect": False}, {"defect": i < 2, "confidence": 0.8}))
    return pairs


def hand_wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@pytest.mark.parametrize(("k", "n"), [(3, 10), (0, 20), (20, 20), (7, 1000), (1, 3)])
def test_wilson_interval_matches_the_formula_by_hand(k: int, n: int) -> None:
    lo, hi = wilson(k, n) or (None, None)
    want = hand_wilson(k, n)
    assert lo == pytest.approx(max(want[0], 0.0), abs=1e-9)
    assert hi == pytest.approx(min(want[1], 1.0), abs=1e-9)


def test_wilson_of_3_in_10_is_the_textbook_interval() -> None:
    assert wilson(3, 10) == pytest.approx((0.1078, 0.6032), abs=1e-4)
    assert wilson(0, 0) is None


def test_escapes_are_bad_parts_passed_and_false_rejects_good_parts_rejected() -> None:
    d = defect_metrics(line(), RULE)
    assert (d["tp"], d["fn"], d["fp"], d["tn"]) == (7, 3, 2, 18)
    assert d["escape"]["count"] == 3 and d["escape"]["of"] == 10 and d["escape"]["rate"] == pytest.approx(0.3)
    assert d["false_reject"]["count"] == 2 and d["false_reject"]["of"] == 20
    assert d["false_reject"]["rate"] == pytest.approx(0.1)
    assert d["escape_ids"] == ["bad7", "bad8", "bad9"]  # swapped, these would be good0 and good1
    assert d["false_reject_ids"] == ["good0", "good1"]
    assert d["escape"]["ci95"] == pytest.approx(list(hand_wilson(3, 10)), abs=1e-9)
    assert d["false_reject"]["ci95"] == pytest.approx(list(hand_wilson(2, 20)), abs=1e-9)
    assert d["precision"] == pytest.approx(7 / 9)
    assert d["recall"] == pytest.approx(7 / 10)
    assert d["f1"] == pytest.approx(2 * (7 / 9) * 0.7 / (7 / 9 + 0.7))


def test_unlabelled_or_failed_samples_are_left_out_of_the_defect_counts() -> None:
    pairs = [*line(), pair("nolabel", {"category": "dent"}, {"defect": True}), pair("failed", {"defect": True}, None)]
    d = defect_metrics(pairs, RULE)
    assert d["evaluated"] == 30 and d["unknown"] == 1


def test_enum_confusion_matrix_counts_label_rows_and_verdict_columns() -> None:
    pairs = [pair("a", {"category": "none"}, {"category": "none"}),
             pair("b", {"category": "none"}, {"category": "scratch"}),
             pair("c", {"category": "scratch"}, {"category": "scratch"}),
             pair("d", {"category": "dent"}, {"category": "none"}),
             pair("e", {"category": "dent"}, {"category": "none"})]
    f = field_metrics(pairs, SCHEMA)["category"]
    assert f["labelled"] == 5 and f["accuracy"] == pytest.approx(2 / 5)
    assert f["confusion"]["labels"] == ["none", "scratch", "dent"]
    assert f["confusion"]["matrix"] == [[1, 1, 0], [0, 1, 0], [2, 0, 0]]


def test_boolean_confusion_and_free_text_exact_and_normalised() -> None:
    pairs = [pair("a", {"defect": True, "notes": "Scratch, left edge"},
                  {"defect": False, "notes": "scratch left  edge"}),
             pair("b", {"defect": False, "notes": "clean"}, {"defect": False, "notes": "clean"}),
             pair("c", {"defect": True, "notes": "dent"}, {"defect": True, "notes": "crack"})]
    fields = field_metrics(pairs, SCHEMA)
    assert fields["defect"]["confusion"] == {"labels": [False, True], "matrix": [[1, 0], [1, 1]]}
    assert fields["notes"]["exact"] == pytest.approx(1 / 3)
    assert fields["notes"]["normalised"] == pytest.approx(2 / 3)
    assert normalise("  Éclat,   BORD ") == "eclat bord"


def test_mcnemar_exact_p_value_by_hand() -> None:
    assert mcnemar_exact(1, 9) == pytest.approx(2 * (1 + 10) / 1024)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 5) == pytest.approx(1.0)


def test_comparison_pairs_escapes_on_the_same_bad_parts() -> None:
    a = line()
    b = [pair(p.sample.id, p.sample.expected, {"defect": True, "confidence": 0.9}) for p in a]  # rejects all
    c = compare(a, b, RULE)
    assert c["paired"] == 30
    assert c["escape"]["of"] == 10 and (c["escape"]["a"], c["escape"]["b"]) == (3, 0)
    assert (c["escape"]["only_a"], c["escape"]["only_b"]) == (3, 0)
    assert c["escape"]["p_value"] == pytest.approx(0.25)  # 2 * (1/2)^3
    assert c["false_reject"]["of"] == 20 and (c["false_reject"]["a"], c["false_reject"]["b"]) == (2, 20)
    assert c["false_reject"]["p_value"] == pytest.approx(2 * 0.5 ** 18) and c["false_reject"]["significant"]


def test_min_confidence_holds_escapes_under_the_target() -> None:
    rows = [(True, False, 0.55), (True, False, 0.62), (True, True, 0.9), (True, True, 0.95),
            (False, False, 0.5), (False, False, 0.7), (False, False, 0.97), (False, True, 0.6)]
    found = threshold_for(rows, 0.0)
    assert found["reachable"] and found["min_confidence"] == pytest.approx(0.620001)
    assert found["escape"]["count"] == 0
    assert found["good_held_for_review"]["count"] == 1 and found["good_held_for_review"]["of"] == 4
    half = threshold_for(rows, 0.25)  # one escape of four is allowed
    assert half["min_confidence"] == pytest.approx(0.550001) and half["escape"]["count"] == 1
    assert threshold_for([(True, False, 1.0), (False, False, 0.5)], 0.0)["reachable"] is False


def test_rule_snippet_is_a_valid_rule_that_reviews_low_confidence_passes() -> None:
    found = threshold_for([(True, False, 0.4), (False, False, 0.9)], 0.0)
    snippet = rule_snippet(found, RULE, "verdict.confidence")
    assert snippet is not None
    rule = Rule.model_validate(yaml.safe_load(snippet)["rules"][0])
    assert [(c.field, c.equals if c.lt is None else c.lt) for c in rule.when] == [
        ("verdict.defect", False), ("verdict.confidence", pytest.approx(0.4))]
    assert rule.actions[0].type == "review"


def test_reliability_bins_confidence_against_correct_decisions() -> None:
    rows = [(True, True, 0.95), (True, False, 0.91), (False, False, 0.15)]
    rel = reliability(rows)
    top, low = rel["bins"][9], rel["bins"][1]
    assert top["count"] == 2 and top["accuracy"] == 0.5 and top["confidence"] == pytest.approx(0.93)
    assert low["count"] == 1 and low["accuracy"] == 1.0
    assert rel["ece"] == pytest.approx(2 / 3 * 0.43 + 1 / 3 * 0.85)


def test_defect_expressions_and_rules_decide_like_the_daemon() -> None:
    cat = parse_defect('verdict.category in ["scratch", "dent"]')
    assert cat.holds({"category": "dent"}) is True and cat.holds({"category": "none"}) is False
    assert cat.holds({"defect": True}) is None  # the field is missing: unknown, not good
    neg = parse_defect('category != "none" and confidence > 0.5')
    assert neg.holds({"category": "dent", "confidence": 0.7}) is True
    assert neg.holds({"category": "none", "confidence": 0.7}) is False
    assert parse_defect("defect == true").holds({"defect": 1}) is False  # JSON true is not 1
    rule = Rule.model_validate({"name": "rej", "when": [{"field": "verdict.defect", "equals": True}],
                                "actions": [{"type": "alert"}]})
    assert rule_defect([rule], "rej").holds({"defect": True}) is True
    with pytest.raises(EdgeRuntimeError, match="no rule of that name"):
        rule_defect([rule], "nope")
    with pytest.raises(EdgeRuntimeError, match="--defect"):
        parse_defect("defect is bad")
