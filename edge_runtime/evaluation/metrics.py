"""Numbers from (expected, verdict) pairs: per-field accuracy and confusion matrices, the defect
decision (precision, recall, F1, escape and false-reject rates with Wilson 95% intervals), latency and
tokens. scikit-learn counts the confusion matrices and precision/recall/F1; scipy gives the Wilson
interval and the exact binomial test behind McNemar's test (compare.py).

Escape = a part that is bad by its label and that the model passed (a false negative of "defect").
False reject = a part good by its label that the model rejected (a false positive).
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.stats import binomtest
from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

from edge_runtime.evaluation.dataset import Sample
from edge_runtime.evaluation.defect import DefectRule


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """The Wilson score interval of k successes in n trials (None when n is 0)."""
    if n <= 0:
        return None
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def rate(k: int, n: int) -> dict[str, Any]:
    """k of n as a rate with its Wilson 95% interval and the counts."""
    ci = wilson(k, n)
    return {"count": k, "of": n, "rate": k / n if n else None, "ci95": list(ci) if ci else None}


@dataclass(frozen=True)
class Pair:
    """One sample with the variant's verdict (None when the image or the inference failed)."""

    sample: Sample
    verdict: dict[str, Any] | None
    record: dict[str, Any]


def defect_metrics(pairs: list[Pair], rule: DefectRule) -> dict[str, Any]:
    """The defect decision: confusion counts, precision/recall/F1, escape and false-reject rates."""
    y_true: list[bool] = []
    y_pred: list[bool] = []
    escapes: list[str] = []
    false_rejects: list[str] = []
    unknown = 0
    for p in pairs:
        if p.verdict is None:
            continue
        truth, pred = rule.holds(p.sample.expected), rule.holds(p.verdict)
        if truth is None or pred is None:
            unknown += 1
            continue
        y_true.append(truth)
        y_pred.append(pred)
        if truth and not pred:
            escapes.append(p.sample.id)
        elif pred and not truth:
            false_rejects.append(p.sample.id)
    out: dict[str, Any] = {"rule": rule.text, "evaluated": len(y_true), "unknown": unknown,
                           "escape_ids": escapes, "false_reject_ids": false_rejects}
    if not y_true:
        return {**out, "tp": 0, "fp": 0, "fn": 0, "tn": 0, "precision": None, "recall": None, "f1": None,
                "escape": rate(0, 0), "false_reject": rate(0, 0), "bad_parts": 0, "good_parts": 0}
    tn, fp, fn, tp = (int(x) for x in confusion_matrix(y_true, y_pred, labels=[False, True]).ravel())
    precision, recall, f1, _ = precision_recall_fscore_support(y_true, y_pred, labels=[True], average="binary",
                                                               pos_label=True, zero_division=0)
    return {**out, "tp": tp, "fp": fp, "fn": fn, "tn": tn, "bad_parts": tp + fn, "good_parts": tn + fp,
            "precision": float(precision) if tp + fp else None, "recall": float(recall) if tp + fn else None,
            "f1": float(f1) if tp + fp and tp + fn else None,
            "escape": rate(fn, tp + fn), "false_reject": rate(fp, fp + tn)}


def region_metrics(pairs: list[Pair], rule: DefectRule) -> dict[str, Any]:
    """Escape and false-reject rates per labelled region (`regions` in the dataset, docs/evaluation.md):
    each labelled region of an image is judged by the same defect rule on its own verdict. A region the
    run gave no verdict (the frame failed, or the region's outcome is `none`) counts as `no_verdict`."""
    names: list[str] = []
    per: dict[str, list[Pair]] = {}
    no_verdict: dict[str, int] = {}
    for p in pairs:
        if not p.sample.regions:
            continue
        got = {str(r.get("name")): r for r in p.record.get("regions") or [] if isinstance(r, dict)}
        for name, label in p.sample.regions.items():
            if name not in per:
                names.append(name)
                per[name], no_verdict[name] = [], 0
            verdict = got.get(name, {}).get("verdict")
            if p.verdict is None and p.record.get("kind") == "bad_image":
                continue  # the image was never inspected: an error of the whole image, not of the region
            if not isinstance(verdict, dict) or got[name].get("outcome") == "none":
                no_verdict[name] += 1
                continue
            per[name].append(Pair(replace(p.sample, id=f"{p.sample.id}#{name}", expected=label, regions=None),
                                  verdict, p.record))
    out: dict[str, Any] = {}
    for name in names:
        m = defect_metrics(per[name], rule)
        out[name] = {k: m[k] for k in ("evaluated", "unknown", "tp", "fp", "fn", "tn", "bad_parts", "good_parts",
                                       "escape", "false_reject", "escape_ids", "false_reject_ids")}
        out[name]["no_verdict"] = no_verdict[name]
    return out


def normalise(text: str) -> str:
    """Case, accents, punctuation and runs of white space do not count."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).casefold()
    return " ".join(re.sub(r"[^\w\s]", " ", text).split())


def field_metrics(pairs: list[Pair], schema: dict[str, Any]) -> dict[str, Any]:
    """Per labelled field: accuracy; enum/boolean a confusion matrix; free text exact and normalised;
    numbers the mean absolute error."""
    props: dict[str, Any] = schema.get("properties") or {}
    out: dict[str, Any] = {}
    for name, sub in props.items():
        got = [(p.sample.expected[name], p.verdict.get(name)) for p in pairs
               if p.verdict is not None and name in p.sample.expected]
        if not got:
            continue
        sub = sub if isinstance(sub, dict) else {}
        kind = sub.get("type")
        exact = sum(1 for e, v in got if _same(e, v))
        entry: dict[str, Any] = {"labelled": len(got), "accuracy": exact / len(got), "correct": exact}
        if kind == "boolean" or isinstance(sub.get("enum"), list):
            values = [False, True] if kind == "boolean" else list(sub["enum"])
            names = [json.dumps(v) for v in values]
            truth = [json.dumps(e) for e, _ in got]
            pred = [json.dumps(v) for _, v in got]
            extra = sorted({*truth, *pred} - set(names))  # e.g. a missing field in a verdict
            labels = names + extra
            entry["confusion"] = {"labels": [json.loads(x) if x != "null" else None for x in labels],
                                  "matrix": confusion_matrix(truth, pred, labels=labels).tolist()}
        elif kind == "string":
            entry["exact"] = exact / len(got)
            entry["normalised"] = sum(1 for e, v in got if isinstance(v, str) and isinstance(e, str)
                                      and normalise(e) == normalise(v)) / len(got)
        elif kind in ("number", "integer"):
            errs = [abs(float(e) - float(v)) for e, v in got if _number(e) and v is not None and _number(v)]
            entry["mean_abs_error"] = float(np.mean(errs)) if errs else None
        out[name] = entry
    return out


def latency_metrics(pairs: list[Pair]) -> dict[str, Any]:
    """p50/p95 of the total inspection time and of the tokens per verdict."""
    totals = [float(p.record["timings_ms"]["total"]) for p in pairs
              if p.verdict is not None and isinstance(p.record.get("timings_ms"), dict)]
    tokens = [int(p.record["tokens"]) for p in pairs if p.verdict is not None
              and isinstance(p.record.get("tokens"), int)]

    def pct(xs: list[float] | list[int], q: float) -> float | None:
        return float(np.percentile(xs, q)) if xs else None

    return {"total_ms": {"p50": pct(totals, 50), "p95": pct(totals, 95), "n": len(totals)},
            "tokens": {"mean": float(np.mean(tokens)) if tokens else None, "p50": pct(tokens, 50),
                       "p95": pct(tokens, 95)},
            "samples_ms": totals}


def _same(a: Any, b: Any) -> bool:
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
