"""Prometheus metrics with prometheus-client, in a registry of our own (no process globals).

Latencies and verdict counts are observed as results arrive; camera, queue, broker and governor
figures are read from the daemon's status at scrape time, so they are never stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from edge_runtime.api.gate_metrics import gate_metrics
from edge_runtime.core.result import STAGES, Result
from edge_runtime.fleet.offload.metrics import offload_metrics
from edge_runtime.lineio.metrics import line_io_metrics

# Seconds, as Prometheus names and units want them (1 ms .. 30 s).
_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)
# Every state a camera can be in: capture.camera.CameraState's values (api may not import capture, the
# import-linter contract; tests/api/test_metrics_camera_state.py fails when a state is missing here).
_CAMERA_STATES = ("connecting", "streaming", "reconnecting", "failed", "ended", "stopping", "stopped")
_LEVELS = frozenset({"clip_frames_held"})  # camera `frames` entries that are levels, not counts


class StatusCollector(Collector):
    def __init__(self, status: Callable[[], dict[str, Any]],
                 health: Callable[[], dict[str, Any]] | None = None,
                 admission: Callable[[], dict[str, Any]] | None = None) -> None:
        self.status, self.health, self.admission = status, health, admission

    def collect(self) -> Iterator[Any]:
        s = self.status()
        yield from health_metrics(s.get("health") or (self.health() if self.health else None))
        yield from thread_metrics(s.get("threads"))
        if self.admission is not None:
            yield from admission_metrics(self.admission())
        frames = CounterMetricFamily("edge_camera_frames", "Frames per camera by outcome",
                                     labels=["camera", "outcome"])
        state = GaugeMetricFamily("edge_camera_state", "1 for the camera's current state",
                                  labels=["camera", "state"])
        fps = GaugeMetricFamily("edge_camera_fps", "Frames captured per second", labels=["camera"])
        held = GaugeMetricFamily("edge_camera_clip_frames_held", "Frames a clip camera's ring holds now",
                                 labels=["camera"])
        for cam in s["cameras"]:
            for outcome, value in cam["frames"].items():
                if outcome in _LEVELS:  # a level that falls, not a count: a counter's rate() would see resets
                    held.add_metric([cam["name"]], value)
                else:
                    frames.add_metric([cam["name"], outcome], value)
            for st in _CAMERA_STATES:
                state.add_metric([cam["name"], st], 1.0 if cam["state"] == st else 0.0)
            fps.add_metric([cam["name"]], cam["fps"])
        yield from (frames, state, fps, held)
        yield GaugeMetricFamily("edge_ready", "Model loaded and warmed up",
                                value=1.0 if s.get("model_loaded", s["ready"]) else 0.0)
        yield GaugeMetricFamily("edge_queue_depth", "Inspections waiting", value=s["inspection"]["queue_depth"])
        yield GaugeMetricFamily("edge_queue_capacity", "Inspection queue size", value=s["inspection"]["queue_size"])
        yield CounterMetricFamily("edge_inspection_errors", "Failed inspections", value=s["inspection"]["errors"])
        draft = s["inspection"].get("draft")
        if draft:  # speculative decoding (model.draft_model)
            tokens = CounterMetricFamily("edge_draft_tokens", "Tokens the draft model guessed, and of them those "
                                         "the language model took", labels=["outcome"])
            tokens.add_metric(["guessed"], draft["guessed"])
            tokens.add_metric(["taken"], draft["taken"])
            yield tokens
            yield CounterMetricFamily("edge_draft_slow_pauses", "Times guessing stopped for costing more time per "
                                      "token than it saved", value=draft["slow_pauses"])
            yield CounterMetricFamily("edge_draft_failures", "Draft proposals that failed (answers went on "
                                      "without them)", value=draft["failures"])
        yield from encoder_cache_metrics(s["inspection"].get("encoder_cache"))
        yield GaugeMetricFamily("edge_journal_results", "Results in the journal", value=s["journal"]["total"])
        yield GaugeMetricFamily("edge_outbox_backlog", "Results not yet acknowledged by the broker",
                                value=s["journal"]["unsent"])
        yield CounterMetricFamily("edge_journal_escaped", "Results stored ASCII-escaped (their text held a lone "
                                  "surrogate)", value=s["journal"].get("escaped", 0))
        yield CounterMetricFamily("edge_journal_resyncs", "Unsent counts recounted from the database (rows written "
                                  "from outside)", value=s["journal"].get("resyncs", 0))
        mqtt = s.get("mqtt") or {}
        if mqtt.get("enabled"):
            yield GaugeMetricFamily("edge_mqtt_connected", "1 while connected to the broker",
                                    value=1.0 if mqtt.get("connected") else 0.0)
            yield CounterMetricFamily("edge_mqtt_published", "Results acknowledged by the broker",
                                      value=mqtt.get("published", 0))
        yield from governor_metrics(s.get("governor"))
        yield from offload_metrics(s.get("offload"))
        yield from line_io_metrics(s.get("line_io"))
        yield from gate_metrics(s.get("gate"))


def encoder_cache_metrics(cache: dict[str, Any] | None) -> Iterator[Any]:
    """The encoder cache (model.encoder_cache_mb): lookups by outcome, what it holds."""
    if not cache:
        return
    lookups = CounterMetricFamily("edge_encoder_cache_lookups", "Image encodings looked up by content, by "
                                  "outcome (a hit is an encode saved)", labels=["outcome"])
    lookups.add_metric(["hit"], cache["hits"])
    lookups.add_metric(["miss"], cache["misses"])
    yield lookups
    yield GaugeMetricFamily("edge_encoder_cache_bytes", "Bytes of image embeddings the encoder cache holds",
                            value=cache["bytes"])
    yield GaugeMetricFamily("edge_encoder_cache_entries", "Image encodings the encoder cache holds",
                            value=cache["entries"])


def health_metrics(health: dict[str, Any] | None) -> Iterator[Any]:
    if not health:
        return
    yield GaugeMetricFamily("edge_runtime_ready", "1 when the device can inspect and journal "
                            "(what /readyz answers; it stays 1 while only degraded)",
                            value=1.0 if health.get("ready") else 0.0)
    degraded = GaugeMetricFamily("edge_runtime_degraded", "1 per open fault (state degraded), named by reason",
                                 labels=["reason"])
    for reason in health.get("reasons") or []:
        degraded.add_metric([str(reason)], 1.0)
    yield degraded


def thread_metrics(threads: dict[str, Any] | None) -> Iterator[Any]:
    """Supervised pipeline threads, when the daemon reports them ({name: {alive, restarts[, busy_s]}})."""
    if not threads:
        return
    alive = GaugeMetricFamily("edge_runtime_thread_alive", "1 while the thread runs", labels=["thread"])
    restarts = CounterMetricFamily("edge_runtime_thread_restarts", "Restarts after the thread died",
                                   labels=["thread"])
    # 0 while the thread waits for work: an alert on it catches a hang well before the 60 s watchdog
    busy = GaugeMetricFamily("edge_runtime_thread_busy_seconds", "How long the piece of work in progress "
                             "(a frame's encode, the gate's look, a batch) has run; 0 while waiting", labels=["thread"])
    for name, t in threads.items():
        alive.add_metric([name], 1.0 if t.get("alive") else 0.0)
        restarts.add_metric([name], t.get("restarts", 0))
        busy.add_metric([name], float(t.get("busy_s") or 0.0))
    yield from (alive, restarts, busy)


def admission_metrics(gates: dict[str, Any]) -> Iterator[Any]:
    in_flight = GaugeMetricFamily("edge_api_in_flight", "Admitted requests holding a thread", labels=["kind"])
    refused = CounterMetricFamily("edge_api_refused", "Requests refused at admission (429/503)", labels=["kind"])
    for kind, gate in gates.items():
        in_flight.add_metric([kind], gate.in_flight)
        refused.add_metric([kind], gate.refused)
    yield from (in_flight, refused)


def webhook_metrics(wh: dict[str, Any] | None) -> Iterator[Any]:
    """Per webhook destination (URL origin), from the outbox's status: a blocked receiver shows here."""
    if not wh:
        return
    labels = ["destination"]
    pending = GaugeMetricFamily("edge_webhook_destination_pending", "Webhook POSTs waiting, per destination",
                                labels=labels)
    in_flight = GaugeMetricFamily("edge_webhook_destination_in_flight_seconds",
                                  "Seconds the current POST has been in flight (0: none)", labels=labels)
    failures = GaugeMetricFamily("edge_webhook_destination_consecutive_failures",
                                 "Failed attempts since the last delivery", labels=labels)
    delivered = CounterMetricFamily("edge_webhook_destination_delivered", "Webhook POSTs acknowledged (2xx)",
                                    labels=labels)
    failed = CounterMetricFamily("edge_webhook_destination_attempts_failed", "Failed webhook attempts",
                                 labels=labels)
    timeouts = CounterMetricFamily("edge_webhook_destination_timeouts", "Webhook POSTs past their deadline",
                                   labels=labels)
    for dest, d in (wh.get("destinations") or {}).items():
        pending.add_metric([dest], d.get("pending", 0))
        in_flight.add_metric([dest], d.get("in_flight_s") or 0.0)
        failures.add_metric([dest], d.get("consecutive_failures", 0))
        delivered.add_metric([dest], d.get("delivered", 0))
        failed.add_metric([dest], d.get("attempts_failed", 0))
        timeouts.add_metric([dest], d.get("timeouts", 0))
    yield from (pending, in_flight, failures, delivered, failed, timeouts)
    yield CounterMetricFamily("edge_webhooks_attempts_failed", "Failed webhook attempts, all destinations",
                              value=wh.get("attempts_failed", 0))


def governor_metrics(gov: dict[str, Any] | None) -> Iterator[Any]:
    if not gov:
        return
    level = GaugeMetricFamily("edge_governor_level", "Governor level (0 normal .. 3 paused)")
    level.add_metric([], gov.get("level_index", 0))
    yield level
    temps = GaugeMetricFamily("edge_temperature_celsius", "Temperatures by sensor", labels=["sensor"])
    for name, value in (gov.get("temperatures") or {}).items():
        temps.add_metric([name], value)
    yield temps
    power = GaugeMetricFamily("edge_power_watts", "Power by rail", labels=["rail"])
    for name, value in (gov.get("power") or {}).items():
        power.add_metric([name], value)
    yield power


class Metrics:
    """The registry plus the result-driven instruments."""

    def __init__(self, status: Callable[[], dict[str, Any]],
                 health: Callable[[], dict[str, Any]] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.admission: dict[str, Any] = {}  # filled by the app factory: kind -> Admission
        self.stage = Histogram("edge_stage_latency_seconds", "Pipeline stage latency in seconds",
                               ["stage"], buckets=_BUCKETS_S, registry=self.registry)
        self.results = Counter("edge_results", "Results by camera and verdict", ["camera", "verdict"],
                               registry=self.registry)
        self.energy = Counter("edge_inspection_energy_joules", "Energy spent on inspections",
                              registry=self.registry)
        self.rails = Counter("edge_rail_fired", "Rails that fired, by rail (the error code) and action (refuse, "
                             "rewrite, filter, reask, reask_skipped)", ["rail", "action"], registry=self.registry)
        self.registry.register(StatusCollector(status, health, lambda: self.admission))

    def rail_fired(self, rail: str, action: str) -> None:
        self.rails.labels(rail, action).inc()

    def observe(self, result: Result) -> None:
        for stage in STAGES:
            if stage in result.timings_ms:
                self.stage.labels(stage).observe(result.timings_ms[stage] / 1000.0)
        defect = result.verdict.get("defect")
        label = "defect" if defect is True else "ok" if defect is False else "other"
        self.results.labels(result.camera, label).inc()
        if result.energy_j:
            self.energy.inc(result.energy_j)
