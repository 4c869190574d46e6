"""Prometheus families for the offload status (read at scrape time from the daemon's status)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_STATES = ("closed", "open", "half_open")


def offload_metrics(status: dict[str, Any] | None) -> Iterator[Any]:
    if not status or not status.get("enabled"):
        return
    frames = CounterMetricFamily("edge_offload_frames", "Frames taken for the central server, by outcome",
                                 labels=["outcome"])
    for outcome, value in status["frames"].items():
        if outcome not in ("taken", "in_flight"):
            frames.add_metric([outcome], value)
    yield frames
    yield _labelled("edge_offload_taken", "Frames taken for the central server, by reason", "reason",
                    status["taken_by_reason"])
    yield _labelled("edge_offload_dropped", "Offloaded frames dropped, by reason", "reason",
                    status["dropped_by_reason"])
    yield GaugeMetricFamily("edge_offload_in_flight", "Frames sent or queued, not yet answered",
                            value=status["frames"]["in_flight"])
    yield CounterMetricFamily("edge_offload_store_failures", "Remote verdicts the journal refused "
                              "(each frame took the fallback instead)", value=status.get("store_failures", 0))
    yield GaugeMetricFamily("edge_offload_degraded", "1 while offload is degraded (see status reasons)",
                            value=1.0 if status.get("state") == "degraded" else 0.0)
    state = GaugeMetricFamily("edge_offload_breaker_state", "1 for the endpoint's circuit state",
                              labels=["endpoint", "state"])
    requests = CounterMetricFamily("edge_offload_requests", "Requests sent", labels=["endpoint"])
    failures = CounterMetricFamily("edge_offload_failures", "Requests failed", labels=["endpoint"])
    opened = CounterMetricFamily("edge_offload_breaker_opened", "Times the circuit opened", labels=["endpoint"])
    latency = CounterMetricFamily("edge_offload_latency_seconds", "Seconds spent in successful requests",
                                  labels=["endpoint"])
    for ep in status["endpoints"]:
        url = ep["url"]
        for st in _STATES:
            state.add_metric([url, st], 1.0 if ep["state"] == st else 0.0)
        requests.add_metric([url], ep["requests"])
        failures.add_metric([url], ep["failures"])
        opened.add_metric([url], ep["opened"])
        latency.add_metric([url], ep["latency_ms_sum"] / 1000)
    yield from (state, requests, failures, opened, latency)


def _labelled(name: str, doc: str, label: str, values: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family
