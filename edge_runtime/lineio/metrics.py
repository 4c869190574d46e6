"""Prometheus families for line I/O (read at scrape time from the daemon's status `line_io`):
triggers, results by outcome, timeouts, overruns, acks and refusals per station, the live signals,
and each protocol server's counters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_COUNTERS = {"triggers": "Triggers taken", "timeouts": "Results reported NOK because no verdict came by the "
             "deadline", "overruns": "Triggers refused because the result FIFO was full", "acks": "Results the "
             "line acknowledged", "late_verdicts": "Verdicts that came after their deadline (the NOK stood)"}
_SIGNALS = ("ready", "busy", "result_valid", "fault", "overrun", "buffer_count", "heartbeat", "inspection_seq")


def line_io_metrics(status: dict[str, Any] | None) -> Iterator[Any]:
    if not status or not status.get("enabled"):
        return
    stations = status.get("stations", [])
    for key, text in _COUNTERS.items():
        family = CounterMetricFamily(f"edge_line_{key}", f"{text}, per station", labels=["station"])
        for st in stations:
            family.add_metric([st["name"]], st["counters"].get(key, 0))
        yield family
    results = CounterMetricFamily("edge_line_results", "Results reported to the line, per station and outcome",
                                  labels=["station", "result"])
    refused = CounterMetricFamily("edge_line_refused", "Triggers refused, per station and reason",
                                  labels=["station", "reason"])
    signals = GaugeMetricFamily("edge_line_signal", "The signals the station shows the line",
                                labels=["station", "signal"])
    for st in stations:
        for outcome in ("ok", "nok", "error"):
            results.add_metric([st["name"], outcome], st["counters"].get(f"results_{outcome}", 0))
        for reason, n in st["counters"].get("refusals", {}).items():
            refused.add_metric([st["name"], reason], n)
        for name in _SIGNALS:
            signals.add_metric([st["name"], name], float(st["signals"].get(name, 0)))
    yield from (results, refused, signals)
    adapters = GaugeMetricFamily("edge_line_server_up", "1 while the protocol server serves", labels=["protocol"])
    events = CounterMetricFamily("edge_line_server_events", "Protocol server counters (calls, refused "
                                 "logins and certificates, ...)", labels=["protocol", "counter"])
    for name, adapter in status.get("adapters", {}).items():
        adapters.add_metric([name], 1.0 if adapter.get("ok") else 0.0)
        for counter, value in adapter.get("counters", {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                events.add_metric([name, counter], value)
    yield from (adapters, events)
