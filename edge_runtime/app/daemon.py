"""The composition root: builds every component from the config, hands each its collaborators as
constructor arguments, starts and stops them in order. `api/` and the MQTT commands get the
`core/device.py` roles as one `DeviceRoles`: the verdicts' queries and reviews are answered by
`verdicts/queries.py`, the cameras and the inference queue by `capture/entry.py`; status and reload
by the Daemon, which delegates them to `StatusReport` and `Reloader`: those read the API and MQTT
services, which are handed the roles when they are built, so they cannot be built before them.

This is the one module that knows the concrete classes. Signals: SIGTERM/SIGINT stop (the
inspection in progress finishes and is journaled), SIGHUP reloads the config file.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from edge_runtime import __version__
from edge_runtime.api import ApiServer
from edge_runtime.app.reload import Reloader
from edge_runtime.app.running import Running
from edge_runtime.app.status import StatusReport
from edge_runtime.capture.entry import EntryPoints
from edge_runtime.capture.rig import CameraRig, cameras_not_in_file, clip_of, stop_rigs
from edge_runtime.config import CameraConfig, Config
from edge_runtime.config.rules import webhook_current, webhook_headers
from edge_runtime.core import systemd
from edge_runtime.core.device import DeviceRoles, ModelInfo
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.core.governor_gate import Gate, OpenGate
from edge_runtime.core.inspection_queue import InspectionQueue, ScheduleStats
from edge_runtime.delivery.mqtt.client import MqttService
from edge_runtime.delivery.mqtt.commands import command_table
from edge_runtime.delivery.mqtt.discovery import homeassistant_discovery
from edge_runtime.delivery.mqtt.outbox import MessageOutbox
from edge_runtime.delivery.webhooks import WebhookOutbox
from edge_runtime.fleet.offload.router import Offloader
from edge_runtime.inference.anomaly.step import GateStep, gates_for
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.model_source import open_inspector
from edge_runtime.inference.worker import InspectionWorker
from edge_runtime.lineio.service import LineIO
from edge_runtime.power.governor import GovernorGate, GovernorService
from edge_runtime.verdicts.journal import Journal
from edge_runtime.verdicts.pipeline import VerdictPipeline
from edge_runtime.verdicts.queries import VerdictQueries
from edge_runtime.verdicts.stage import VerdictServices

log = logging.getLogger(__name__)


class Service(Protocol):
    """A part the daemon starts after the model and stops before it; `stop` tolerates a part never started."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Daemon:
    """The running device: model, journal, cameras, schedules and the inspection worker.

    It builds the parts, connects them, starts and stops them; `report` answers status and health,
    `reloader` applies a re-read config file; both read what a reload replaces from `running`."""

    def __init__(self, config: Config, model_dir: str | None = None, config_path: Path | None = None, *,
                 gate: Gate | None = None) -> None:
        """`gate`: the frames' gate instead of the governor's (tests); the governor still runs if enabled."""
        self.running = Running(config, file_config=config)
        self.model_dir = model_dir
        self.config_path = config_path
        # Cameras the command line added beyond the file (`run --demo`): a reload keeps them.
        self.extra_cameras = cameras_not_in_file(config, config_path)
        self.started = time.time()
        self.governor = GovernorService.from_config(config.governor) if config.governor.enabled else None
        self.gate: Gate = gate or (GovernorGate(self.governor) if self.governor is not None else OpenGate())
        self.inspections = InspectionQueue(config.inspection.queue_size)
        # Unsent rows are kept through retention only while an outbox will ever send them.
        self.journal = Journal(config.journal_path(), config.journal.max_rows, config.journal.max_age_days,
                               keep_unsent=config.mqtt.enabled, min_free_mb=config.journal.min_free_mb)
        self._stop = threading.Event()
        self._reload = threading.Event()
        # Short reasons of faults that currently stop inspection or delivery ("disk full", …); see health().
        self.faults: set[str] = set()
        # The anomaly gate per camera and line recipe (inference/anomaly/step.py); its heat map goes on
        # the evidence image when evidence is kept.
        self.gates = GateStep(heat_wanted=config.evidence.enabled)
        # Evidence, rules, alerts, webhooks and reviews around the journal (verdicts/stage.py).
        mqtt_wake = threading.Event()  # alerts and reviews committed: the MQTT service sends them
        self.messages = MessageOutbox(config.journal_path(), wake=mqtt_wake.set)
        # Rules' webhooks: staged by the verdict stage in the result's transaction, sent by this sink.
        self.webhooks = WebhookOutbox(config.journal_path(),
                                      headers_for=lambda source: webhook_headers(self.config.rules, source),
                                      current=lambda source, url: webhook_current(self.config.rules, source, url))
        self.verdicts = VerdictServices(config.evidence, config.rules, config.data_dir, config.journal_path(),
                                        self.faults, self._current_inspector, webhooks=self.webhooks,
                                        messages=self.messages, keep_undelivered=config.mqtt.enabled,
                                        budget=config.rules_budget, evidence_overlay=self.gates.overlay,
                                        gate=lambda: self.gate.decision())  # re-asks wait out a throttled governor
        # Every verdict, local or remote, takes one path: the stage around the journal row, then the sinks
        # (verdicts/pipeline.py), filled below.
        self.pipeline = VerdictPipeline(self.journal, self._stats_for, self.verdicts)
        self.sinks = self.pipeline.sinks
        self.worker = InspectionWorker(self.inspections, self._current_inspector, self.journal,
                                       self.pipeline.deliver, self.gate, self._stats_for,
                                       overlap=config.inspection.overlap_stages,
                                       max_batch=config.inspection.max_batch, gates=self.gates,
                                       energy=self.governor.energy_j if self.governor is not None else None)
        # What api/ and the MQTT commands see of the device, one part per role (core/device.py).
        queries = VerdictQueries(self.journal, self.verdicts, self._current_inspector)
        self.entry = EntryPoints(self.running, self.inspections, self.journal, self._current_inspector)
        self.device = DeviceRoles(status=self, results=queries, cameras=self.entry, inference=self.entry,
                                  review=queries, control=self)
        self.mqtt = self._mqtt(config, mqtt_wake) if config.mqtt.enabled else None
        self.api = ApiServer(self.device, config.api) if config.api.enabled else None
        self.offload = self._offload(config) if config.offload.enabled else None
        # The line's stations and their OPC UA/Modbus/... servers (lineio/service.py), when configured.
        self.line_io = LineIO(self, config.line_io) if config.line_io is not None and config.line_io.stations else None
        # Every consumer of a committed verdict (core/sink.py), in one list.
        self.sinks += [sink for sink in (self.webhooks, self.mqtt, self.api, self.line_io,
                                         self.offload.escalation if self.offload else None) if sink is not None]
        # Started after the model in this order, stopped in reverse: the governor first (cameras start
        # behind its gate); offload stops before the API, MQTT and the verdict stage (its queued frames are
        # counted drops); the verdict stage, stopped last, closes the outboxes it stages into.
        self.services: list[Service] = [service for service in (
            self.governor, self.verdicts, self.webhooks, self.mqtt, self.api, self.offload, self.line_io)
            if service is not None]
        self.report = StatusReport(self.running, started=self.started, faults=self.faults,
                                   inspections=self.inspections, journal=self.journal, worker=self.worker,
                                   pipeline=self.pipeline, verdicts=self.verdicts, webhooks=self.webhooks,
                                   gate=self.gate, mqtt=self.mqtt,
                                   offload=self.offload, line_io=self.line_io)
        self.reloader = Reloader(self.running, config_path, extra_cameras=self.extra_cameras, journal=self.journal,
                                 verdicts=self.verdicts, gates=self.gates, faults=self.faults, api=self.api,
                                 mqtt=self.mqtt, load_inspector=self._load_inspector,
                                 start_camera=self._start_camera)

    # ---- what a reload replaces (kept in `running`, shared with the report and the reloader) ----

    @property
    def config(self) -> Config:
        return self.running.config

    @property
    def inspector(self) -> Inspector | None:
        return self.running.inspector

    @property
    def rigs(self) -> dict[str, CameraRig]:
        return self.running.rigs

    def _mqtt(self, config: Config, wake: threading.Event) -> MqttService:
        discovery: Callable[[], list[tuple[str, str]]] | None = None
        if config.mqtt.homeassistant.enabled:
            ha = config.mqtt.homeassistant.discovery_prefix
            discovery = lambda: homeassistant_discovery(  # noqa: E731 - the configs of the cameras running now
                ha, self.config.topic_prefix(), self.config.device_id, sorted(self.rigs), __version__)
        return MqttService(config.mqtt, config.device_id, config.topic_prefix(), self.journal,
                           self.telemetry, command_table(self.device), discovery=discovery,
                           messages=self.messages, wake=wake)  # alerts and reviews, from the journal's file too

    def _offload(self, config: Config) -> Offloader:
        """Scale-out (docs/scale-out.md): remote results are journaled and published like local ones."""
        return Offloader(
            config.offload, {c.name for c in config.cameras if c.remote}, config.device_id,
            self._current_inspector, self.pipeline.deliver, self.inspections.submit, lambda: self.gate.decision(),
            lambda reason, active: self.faults.add(reason) if active else self.faults.discard(reason))

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.perf_counter()
        inspector = self.running.inspector = self._load_inspector(self.config)
        self.gates.install(gates_for(inspector.bundle, self.config))  # a bank that does not fit: one line
        self.worker.start()
        for service in self.services:  # governor first: cameras start behind its gate
            service.start()
        for cfg in self.config.cameras:
            self._start_camera(cfg)
        if self.mqtt is not None:
            self.mqtt.publish_discovery()
        log.info("daemon: ready in %.1f s (model %s, %d cameras)", time.perf_counter() - t0,
                 inspector.model_name, len(self.rigs))
        systemd.notify("READY=1\nSTATUS=inspecting")

    def stop(self) -> None:
        systemd.notify("STOPPING=1")
        log.info("daemon: stopping")
        rigs, self.running.rigs = self.rigs, {}
        stop_rigs(rigs.values())  # together: one 3 s wait however many capture threads are stuck in a read
        self.worker.stop()  # finishes and journals the inspection in progress
        for service in reversed(self.services):
            try:
                service.stop()  # a service that never started must tolerate stop()
            except Exception:
                log.exception("daemon: stopping %s failed", type(service).__name__)
        if self.inspector is not None:
            self.inspector.close()
            self.running.inspector = None
        self.journal.close()
        log.info("daemon: stopped")

    def request_stop(self) -> None:
        self._stop.set()

    def run_forever(self) -> None:
        """Start, then serve until SIGTERM/SIGINT; SIGHUP reloads the config."""
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        signal.signal(signal.SIGHUP, lambda *_: self._reload.set())
        watchdog = systemd.watchdog_interval()
        try:
            self.start()
            while not self._stop.wait(min(watchdog or 1.0, 1.0)):
                if self._reload.is_set():
                    self._reload.clear()
                    try:
                        self.reload()
                    except EdgeRuntimeError:
                        pass  # already logged as one line
                    except Exception:  # a reload must never end the daemon
                        log.exception("daemon: reload failed; keeping the running config")
                if watchdog and self.alive():
                    systemd.notify("WATCHDOG=1")
        finally:
            self.stop()

    # ---- control and status (the rest of the Device roles answered here) ------------------------------

    def reload(self) -> dict[str, Any]:
        """Re-read the config file (app/reload.py): what was applied, what needs a restart."""
        return self.reloader.reload()

    def health(self) -> dict[str, Any]:
        return self.report.health()

    def alive(self) -> bool:
        return self.report.alive()

    def status(self) -> dict[str, Any]:
        return self.report.status()

    def telemetry(self) -> dict[str, Any]:
        return self.report.telemetry()

    def camera_names(self) -> list[str]:
        return sorted(self.rigs)

    def model_info(self) -> ModelInfo | None:
        return self.inspector.info(self.config.model.context_size) if self.inspector is not None else None

    def verdict_status(self) -> dict[str, Any] | None:
        return self.report.verdict_status()

    # ---- internals ---------------------------------------------------------------------------

    def _current_inspector(self) -> Inspector:
        if self.inspector is None:
            raise EdgeRuntimeError("the model is not loaded")
        return self.inspector

    def _stats_for(self, camera: str) -> ScheduleStats | None:
        rig = self.rigs.get(camera)
        return rig.schedule.stats if rig else None

    def _start_camera(self, cfg: CameraConfig) -> None:
        if not cfg.enabled:
            log.info("daemon: camera %s is disabled", cfg.name)
            return
        rig = CameraRig(cfg, self.inspections, self.gate, self.config.inspection.overlap_stages, self.config.images,
                        clip_of(self.config, cfg), self.offload)
        if self.offload is not None:
            self.offload.set_remote(cfg.name, cfg.remote)  # a reload may flip `remote`
        self.running.rigs = {**self.rigs, cfg.name: rig}
        rig.start()
        log.info("daemon: camera %s started (%s, trigger %s)", cfg.name, rig.camera.kind, cfg.trigger.mode)

    def _load_inspector(self, config: Config) -> Inspector:
        return open_inspector(config, self.model_dir)

