"""The device's own report: readiness (`health`, what /readyz answers), the full `status` (REST, the
page, metrics), the periodic MQTT telemetry, the supervised threads. `app.daemon.Daemon` answers with
it, so the composition root only builds, starts and stops."""

from __future__ import annotations

import time
from typing import Any

from edge_runtime import __version__
from edge_runtime.app.running import Running
from edge_runtime.capture.camera import stopping_cameras
from edge_runtime.capture.rig import camera_status, failing_cameras, stuck_clips, telemetry_message
from edge_runtime.core.governor_gate import Gate
from edge_runtime.core.inspection_queue import InspectionQueue
from edge_runtime.core.supervise import SupervisedThread
from edge_runtime.delivery.mqtt.client import MqttService
from edge_runtime.delivery.webhooks import WebhookOutbox
from edge_runtime.fleet.offload.router import Offloader
from edge_runtime.inference.worker import InspectionWorker
from edge_runtime.lineio.service import LineIO
from edge_runtime.verdicts.journal import Journal
from edge_runtime.verdicts.pipeline import VerdictPipeline
from edge_runtime.verdicts.stage import VerdictServices

STALL_S = 60.0  # a stage on one piece of work this long has hung: /readyz 503, no systemd watchdog ping


class StatusReport:
    """The status half of `core.device.Device`, read from the parts it is given."""

    def __init__(self, running: Running, *, started: float, faults: set[str], inspections: InspectionQueue,
                 journal: Journal, worker: InspectionWorker, pipeline: VerdictPipeline, verdicts: VerdictServices,
                 webhooks: WebhookOutbox, gate: Gate, mqtt: MqttService | None, offload: Offloader | None,
                 line_io: LineIO | None) -> None:
        self.running = running
        self.started = started
        self.faults = faults  # shared with the daemon's parts, which add and discard their own reasons
        self.inspections = inspections
        self.journal = journal
        self.worker = worker
        self.pipeline = pipeline
        self.verdicts = verdicts
        self.webhooks = webhooks
        self.gate = gate
        self.mqtt = mqtt
        self.offload = offload
        self.line_io = line_io
        self._telemetry_mark = (time.monotonic(), 0)

    def health(self) -> dict[str, Any]:
        """Cheap readiness snapshot for /readyz, telemetry, metrics and the page (no journal query).

        ``ready`` means the device can inspect and journal: the model is loaded and warmed up, the
        worker turns, the journal (and the line's job store) can write. ``state`` is ``starting``
        (model not loaded), ``ok``, or ``degraded`` with one short reason per fault; a fault of a
        peer (a webhook receiver, the broker, a central server, a PLC link) or of the evidence
        store degrades the device without making it unready: inspection goes on, the results wait
        in the journal, and an OTA health gate must not undo a good update for it. Faults heal by
        themselves.
        """
        # Faults that heal by themselves are re-derived here from their source, so they clear with it.
        if self.journal.full:
            self.faults.add("disk full")
        else:
            self.faults.discard("disk full")
        inspector = self.running.inspector
        model_ready = bool(inspector and inspector.ready)
        stalled = self.stalled()
        alive = stalled is None
        # What stops inspecting or journaling: only these make /readyz answer 503.
        store_fault = self.line_io.jobs.fault() if self.line_io else None
        can_journal = not self.journal.full and not store_fault
        reasons = sorted(self.faults)
        if model_ready and stalled:
            reasons.insert(0, f"inspection stalled: {stalled}")
        reasons += [f"{name}: {h.detail}" for name, h in self.pipeline.health().items() if not h.ok]  # the sinks
        reasons += stopping_cameras()  # a stopped camera whose thread is stuck in a read still holds its device
        reasons += stuck_clips(self.running.rigs.values())  # a camera that streams but is never asked
        reasons += failing_cameras(self.running.rigs.values())  # ... or asked, and every verdict fails
        if store_fault and not any(r.startswith("line_io: ") for r in reasons):  # the sink names it first
            reasons.append(f"line_io: job store: {store_fault}")
        ready = model_ready and alive and can_journal
        state = "ok" if ready and not reasons else ("starting" if not model_ready and not reasons else "degraded")
        return {"ready": ready, "state": state, "reasons": reasons}

    def alive(self) -> bool:
        """The pipeline really works: every stage turns and none has hung on a frame."""
        return self.stalled() is None

    def stalled(self) -> str | None:
        """Why the pipeline does not work (no model, a stage ended or hung for 60 s); None when it does."""
        if self.running.inspector is None:
            return "no model loaded"
        return self.worker.stalled(max_busy_s=STALL_S)

    def threads(self) -> list[SupervisedThread]:
        """Every supervised pipeline thread (schedules, both inspection stages, the MQTT outbox, line I/O)."""
        threads = self.worker.threads() + (self.mqtt.threads() if self.mqtt else [])
        threads += self.line_io.threads() if self.line_io else []
        for rig in self.running.rigs.values():
            threads += rig.schedule.threads()
        return threads

    def status(self) -> dict[str, Any]:
        rigs, config = self.running.rigs, self.running.config  # one snapshot: both are replaced, not mutated
        cameras = [camera_status(rig) for rig in rigs.values()]
        inspector = self.running.inspector
        health = self.health()  # the one source of truth: status.ready is what /readyz answers
        return {
            "device": config.device_id,
            "version": __version__,
            "uptime_s": round(time.time() - self.started, 1),
            "ready": health["ready"],
            "model_loaded": bool(inspector and inspector.ready),
            "health": health,
            "model": inspector.bundle.describe() if inspector else None,
            "cameras": cameras,
            "inspection": {"queue_depth": self.inspections.depth, "queue_size": self.inspections.maxsize,
                           "inspected": self.pipeline.delivered, "errors": self.worker.errors,
                           "not_journaled": self.worker.not_journaled,
                           "batched_generations": self.worker.batches,
                           "draft": inspector.language.drafter.status()
                           if inspector and inspector.language.drafter else None,
                           "energy_j_last": self.worker.last_energy_j,
                           "encoder_cache": inspector.encoder_cache.stats() if inspector else None,
                           "encoder_lanes": list(inspector.encoder.lane_encodes) if inspector else None},
            "journal": {**self.journal.counts(), "full": self.journal.full, "pruned": self.journal.pruned,
                        "escaped": self.journal.escaped, "resyncs": self.journal.resyncs,
                        "free_mb": None if self.journal.free_bytes is None
                        else round(self.journal.free_bytes / 1048576, 1)},
            "threads": {t.name: t.status() for t in self.threads()},
            "mqtt": self.mqtt.state() if self.mqtt else {"enabled": False},
            "governor": self.gate.decision().state,
            "offload": self.offload.status() if self.offload else {"enabled": False},
            "line_io": self.line_io.status() if self.line_io else {"enabled": False},
            "gate": self.worker.gates.status() if self.worker.gates else {},  # per gated camera
            **self.verdict_status(),
        }

    def verdict_status(self) -> dict[str, Any]:
        """Evidence, rules (firings per rule), webhooks and reviews: the page's and /metrics' share."""
        return {**self.verdicts.status(), "webhooks": self.webhooks.status()}

    def telemetry(self) -> dict[str, Any]:
        """The periodic health message: camera states and rates, throughput, backlog, governor."""
        now, inspected = time.monotonic(), self.pipeline.delivered
        then, before = self._telemetry_mark
        self._telemetry_mark = (now, inspected)
        status = self.status()
        message = telemetry_message(status, (inspected - before) * 60 / max(now - then, 1e-6))
        if status["gate"]:  # the anomaly gate's decisions per camera (no histogram: that is /metrics)
            message["gate"] = {name: {k: v for k, v in g.items() if k not in ("histogram", "bank")}
                               for name, g in status["gate"].items()}
        return message
