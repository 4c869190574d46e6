"""The anomaly gate's figures for /metrics, read from the status snapshot's `gate` (per camera)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily


def gate_metrics(gates: dict[str, Any] | None) -> Iterator[Any]:
    """Decisions, calls saved, audits, disagreements and the score histogram of each gated camera."""
    if not gates:
        return
    decisions = CounterMetricFamily("edge_gate_decisions", "Frames the anomaly gate scored, by decision: gated "
                                    "(under the threshold), passed (at or over it: to the language model), error "
                                    "(not scored: to the language model)", labels=["camera", "decision"])
    skipped = CounterMetricFamily("edge_gate_skipped", "Gated frames answered OK without the language model "
                                  "(skip_ok)", labels=["camera"])
    audits = CounterMetricFamily("edge_gate_audits", "Gated frames sent to the language model anyway (skip_ok's "
                                 "audits)", labels=["camera"])
    disagree = CounterMetricFamily("edge_gate_disagreements", "Audits the language model called NOK (the gate "
                                   "said OK)", labels=["camera"])
    answered = CounterMetricFamily("edge_gate_regions_answered", "Regions of an inspection program under their "
                                   "threshold answered OK by the gate in frames that went to the language model for "
                                   "their other regions (skip_ok)", labels=["camera"])
    threshold = GaugeMetricFamily("edge_gate_threshold", "The threshold in use", labels=["camera"])
    scores = HistogramMetricFamily("edge_gate_score_ratio", "Gate scores as a share of the threshold (under 1: "
                                   "gated)", labels=["camera"])
    for camera, g in gates.items():
        for decision in ("gated", "passed", "errors"):
            decisions.add_metric([camera, decision.removesuffix("s") if decision == "errors" else decision],
                                 g[decision])
        skipped.add_metric([camera], g["skipped"])
        audits.add_metric([camera], g["audits"])
        disagree.add_metric([camera], g["disagreements"])
        answered.add_metric([camera], g.get("regions_answered", 0))
        threshold.add_metric([camera], g["threshold"])
        h = g["histogram"]
        scores.add_metric([camera], [(str(b), n) for b, n in h["buckets"]],
                          h["sum"])
    yield from (decisions, skipped, audits, disagree, answered, threshold, scores)
