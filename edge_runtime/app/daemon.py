"""The composition root: builds every component from the config, hands each its collaborators as
constructor arguments, starts and stops them in order; the `core/device.py` roles it answers delegate
to the part that owns the data (`StatusReport`, `Reloader`, the journal, the verdict stage).

This is the one module that knows the concrete classes. Signals: SIGTERM/SIGINT stop (the
inspection in progress finishes and is journaled), SIGHUP reloads the config file.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from edge_runtime import __version__
from edge_runtime.api import ApiServer
from edge_runtime.app.reload import Reloader
from edge_runtime.app.running import Running
from edge_runtime.app.status import StatusReport
from edge_runtime.capture.rig import CameraRig, cameras_not_in_file, clip_of
from edge_runtime.config import CameraConfig, Config
from edge_runtime.config.rules import webhook_headers
from edge_runtime.core import systemd
from edge_runtime.core.device import ChatJob, ChatOutput, Device, EvidenceFile, ModelInfo
from edge_runtime.core.errors import EdgeRuntimeError, StorageFull, UnknownCamera
from edge_runtime.core.governor_gate import Gate, OpenGate
from edge_runtime.core.inspection_queue import InspectionQueue, InspectionRequest, ScheduleStats
from edge_runtime.core.result import Result
from edge_runtime.core.result_filter import ResultFilter
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
from edge_runtime.power.sensors import detect_sensor
from edge_runtime.verdicts.journal import Journal
from edge_runtime.verdicts.pipeline import VerdictPipeline
from edge_runtime.verdicts.stage import VerdictServices

log = logging.getLogger(__name__)
T = TypeVar("T")


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
        self.governor = _governor(config) if config.governor.enabled else None
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
                                      headers_for=lambda source: webhook_headers(self.config.rules, source))
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
        self.mqtt = self._mqtt(config, mqtt_wake) if config.mqtt.enabled else None
        self.api = ApiServer(self, config.api) if config.api.enabled else None
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

    @config.setter
    def config(self, config: Config) -> None:
        self.running.config = config

    @property
    def inspector(self) -> Inspector | None:
        return self.running.inspector

    @inspector.setter
    def inspector(self, inspector: Inspector | None) -> None:
        self.running.inspector = inspector

    @property
    def rigs(self) -> dict[str, CameraRig]:
        return self.running.rigs

    @rigs.setter
    def rigs(self, rigs: dict[str, CameraRig]) -> None:
        self.running.rigs = rigs

    def _mqtt(self, config: Config, wake: threading.Event) -> MqttService:
        discovery: Callable[[], list[tuple[str, str]]] | None = None
        if config.mqtt.homeassistant.enabled:
            ha = config.mqtt.homeassistant.discovery_prefix
            discovery = lambda: homeassistant_discovery(  # noqa: E731 - the configs of the cameras running now
                ha, self.config.topic_prefix(), self.config.device_id, sorted(self.rigs), __version__)
        return MqttService(config.mqtt, config.device_id, config.topic_prefix(), self.journal,
                           self.telemetry, command_table(self), discovery=discovery,
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
        self.inspector = self._load_inspector(self.config)
        self.gates.install(gates_for(self.inspector.bundle, self.config))  # a bank that does not fit: one line
        self.worker.start()
        for service in self.services:  # governor first: cameras start behind its gate
            service.start()
        for cfg in self.config.cameras:
            self._start_camera(cfg)
        if self.mqtt is not None:
            self.mqtt.publish_discovery()
        log.info("daemon: ready in %.1f s (model %s, %d cameras)", time.perf_counter() - t0,
                 self.inspector.model_name, len(self.rigs))
        systemd.notify("READY=1\nSTATUS=inspecting")

    def stop(self) -> None:
        systemd.notify("STOPPING=1")
        log.info("daemon: stopping")
        rigs, self.rigs = self.rigs, {}
        for rig in rigs.values():
            rig.stop()
        self.worker.stop()  # finishes and journals the inspection in progress
        for service in reversed(self.services):
            try:
                service.stop()  # a service that never started must tolerate stop()
            except Exception:
                log.exception("daemon: stopping %s failed", type(service).__name__)
        if self.inspector is not None:
            self.inspector.close()
            self.inspector = None
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

    # ---- inspection entry points ---------------------------------------------------------------

    def trigger(self, camera: str, prompt: str | None = None) -> Future[Result]:
        """Inspect a camera's newest frame now (any trigger mode). Raises QueueFull or UnknownCamera."""
        rig = self.rigs.get(camera)
        if rig is None:
            raise UnknownCamera(f"no camera named {camera!r}")
        if self.journal.refusing():
            raise StorageFull("disk full: the journal cannot store results; free space on the device")
        frame = rig.camera.slot.peek()
        if frame is None:
            raise EdgeRuntimeError(f"camera {camera!r} has no frame yet (state: {rig.camera.state.value})")
        return self.inspections.submit(InspectionRequest(
            frame.image, camera, prompt or rig.cfg.prompt, frame.seq, frame.capture_ms, "trigger"))

    def submit_image(self, image: np.ndarray, prompt: str | None = None, camera: str = "api",
                     journal: bool = False) -> Future[Result]:
        """Inspect an uploaded image through the shared queue. Raises QueueFull."""
        return self.inspections.submit(InspectionRequest(image, camera, prompt, journal=journal))

    def submit_job(self, job: Callable[[Any], T]) -> Future[T]:
        """Run `job(inspector)` in the worker, in turn with inspections (chat completions). Raises QueueFull."""
        return self.inspections.submit(InspectionRequest(None, "openai", journal=False, job=job))

    def latest_jpeg(self, camera: str) -> bytes | None:
        rig = self.rigs.get(camera)
        if rig is None:
            raise UnknownCamera(f"no camera named {camera!r}")
        return rig.latest_jpeg(self.config.inspection.jpeg_quality)

    def reload(self) -> dict[str, Any]:
        """Re-read the config file (app/reload.py): what was applied, what needs a restart."""
        return self.reloader.reload()

    # ---- queries (the rest of Device) ----------------------------------------------------------

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
        inspector = self.inspector
        if inspector is None:
            return None
        return ModelInfo(str(inspector.bundle.manifest.name), inspector.model_name, inspector.ready,
                         inspector.max_tokens, self.config.model.context_size,
                         inspector.bundle.manifest.verdict_schema, inspector.several_images)

    def get_result(self, result_id: str) -> dict[str, Any] | None:
        return self.journal.get(result_id)

    def query_results(self, camera: str | None = None, since: str | None = None, until: str | None = None,
                      limit: int = 50, before_seq: int | None = None) -> list[dict[str, Any]]:
        return self.journal.query(camera, since, until, limit, before_seq)

    def constraint(self, schema: dict[str, Any]) -> str:
        return self._current_inspector().constraint(schema)

    def chat(self, job: ChatJob) -> Future[ChatOutput]:
        """Queue a chat completion: the worker generates it in the same batched decode as the cameras'
        verdicts and other chats (its image encoded ahead like a frame). Raises QueueFull."""
        future: Future[ChatOutput] = self.inspections.submit(InspectionRequest(
            job.image, "openai", journal=False, chat=job))
        if job.on_end is not None:
            on_end = job.on_end
            # Whatever settles it (its generation, a failure, the daemon stopping): the stream ends.
            future.add_done_callback(lambda _future: on_end())
        return future

    def verdict_status(self) -> dict[str, Any] | None:
        return self.report.verdict_status()

    def evidence_file(self, result_id: str, thumbnail: bool = False) -> EvidenceFile | None:
        return self.verdicts.evidence_file(result_id, thumbnail)

    def query_inspections(self, f: ResultFilter) -> tuple[list[dict[str, Any]], int | None]:
        return self.verdicts.reviews.query(f)

    def iterate_inspections(self, f: ResultFilter) -> Iterator[dict[str, Any]]:
        return self.verdicts.reviews.iterate(f)

    def verdict_error(self, verdict: dict[str, Any]) -> tuple[str, str] | None:
        errors = sorted(self._current_inspector().validator.iter_errors(verdict), key=str)
        return (errors[0].message, "".join(f".{p}" for p in errors[0].absolute_path)) if errors else None

    def review_result(self, result: dict[str, Any], action: str, correction: dict[str, Any] | None,
                      note: str | None) -> dict[str, Any]:
        return self.verdicts.reviews.write(result, action, correction, note)

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
        self.rigs = {**self.rigs, cfg.name: rig}
        rig.start()
        log.info("daemon: camera %s started (%s, trigger %s)", cfg.name, rig.camera.kind, cfg.trigger.mode)

    def _load_inspector(self, config: Config) -> Inspector:
        return open_inspector(config, self.model_dir)


def _governor(config: Config) -> GovernorService:
    try:
        sensor = detect_sensor(config.governor.sensor, config.governor.replay_file)
    except (RuntimeError, ValueError) as exc:
        raise EdgeRuntimeError(f"governor: {exc}") from None
    return GovernorService(config.governor, sensor)


def _as_device(daemon: Daemon) -> Device:
    """Never called: mypy checks here that the composition root implements the interface it hands out."""
    return daemon
