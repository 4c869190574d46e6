"""Line I/O wired into the daemon: the stations (one per `line_io.stations` entry), their job store in
the journal's file, and the protocol adapters (OPC UA, Modbus TCP, Sparkplug B, GPIO) that serve them.

A line trigger takes the camera's next frame (`CameraSchedule.capture_for_line`), whose inspection
goes through the shared queue like any other with the job's `LineTag` on its request; the pipeline
puts station, part id, recipe and job id on the Result before it is journaled, and the station learns
the verdict after the commit.
Only this module knows the concrete classes; the adapters see only `Station`s. docs/line-io.md.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from edge_runtime.capture.camera import CameraState
from edge_runtime.capture.rig import CameraRig
from edge_runtime.config import CameraConfig, Config
from edge_runtime.config.line_io import LineIOConfig
from edge_runtime.core.errors import ConfigError, EdgeRuntimeError, StorageFull
from edge_runtime.core.inspection_queue import LineTag
from edge_runtime.core.result import Result
from edge_runtime.core.sink import SinkHealth
from edge_runtime.inference.inspector import Inspector
from edge_runtime.lineio.ota_lock import LineJobsLock
from edge_runtime.lineio.signals import JobRequest
from edge_runtime.lineio.station import Station
from edge_runtime.verdicts.journal import Journal
from edge_runtime.verdicts.line_jobs import LineJobs

if TYPE_CHECKING:
    from edge_runtime.core.inspection_queue import InspectionRequest


class LineHost(Protocol):
    """What line I/O reads of the daemon (`app.daemon.Daemon`); a protocol, so lineio/ imports no app."""

    @property
    def config(self) -> Config: ...

    @property
    def extra_cameras(self) -> list[CameraConfig]: ...

    @property
    def rigs(self) -> dict[str, CameraRig]: ...

    @property
    def journal(self) -> Journal: ...

    @property
    def inspector(self) -> Inspector | None: ...

log = logging.getLogger(__name__)
_DOWN = {CameraState.FAILED, CameraState.RECONNECTING, CameraState.ENDED, CameraState.STOPPED}


class LineIO:
    """The stations and their adapters, as one daemon service (started after the model is loaded) and
    one sink (the stations learn their verdicts after the journal commit)."""

    name = "line_io"

    def __init__(self, daemon: LineHost, cfg: LineIOConfig) -> None:
        self._daemon = daemon
        self.cfg = cfg
        cameras = {c.name for c in daemon.config.cameras} | {c.name for c in daemon.extra_cameras}
        for i, st in enumerate(cfg.stations):
            if st.camera not in cameras:
                raise ConfigError(f"line_io.stations.{i}.camera: no camera named {st.camera!r} is configured "
                                  f"(cameras: {', '.join(sorted(cameras)) or 'none'})")
        self.jobs = LineJobs(daemon.config.journal_path())
        self.stations = [Station(st, self.jobs, self._start_job, warm=self._warm_for(st.camera),
                                 fault=self._fault_for(st.camera)) for st in cfg.stations]
        self.adapters: list[Any] = self._adapters()
        lock_file = daemon.config.ota.lock_file  # the update agent waits while a job is in flight
        self.update_lock = LineJobsLock(lock_file) if lock_file is not None else None
        self._started = False

    def _adapters(self) -> list[Any]:
        adapters: list[Any] = []
        if not self.stations:
            return adapters
        if self.cfg.opcua.enabled:
            try:  # asyncua only when OPC UA is on
                from edge_runtime.lineio.opcua.server import OpcUaServer
            except ModuleNotFoundError as exc:
                raise ConfigError(f"line_io.opcua.enabled needs the OPC UA server package ({exc.name}): "
                                  "pip install 'edge-runtime[lineio]'") from None

            config, opcua = self._daemon.config, self.cfg.opcua
            adapters.append(OpcUaServer(self.stations, opcua, opcua.pki_dir or config.data_dir / "opcua",
                                        opcua.application_uri or f"urn:{config.device_id}:edge-runtime"))
        if self.cfg.modbus.enabled:
            from edge_runtime.lineio.modbus import ModbusServer

            adapters.append(ModbusServer(self.stations, self.cfg.modbus))
        if self.cfg.sparkplug.enabled:
            from edge_runtime.delivery.mqtt.client import configure_client
            from edge_runtime.lineio.sparkplug.node import SparkplugNode

            config = self._daemon.config
            mqtt_cfg = config.mqtt  # the broker of the daemon's own connection; a connection of its own
            adapters.append(SparkplugNode(self.stations, self.cfg.sparkplug, mqtt_cfg, config.device_id,
                                          config.data_dir / "sparkplug" / "bdseq",
                                          configure=lambda client: configure_client(client, mqtt_cfg)))
        if self.cfg.gpio.enabled:
            from edge_runtime.lineio.gpio import GpioService

            adapters.append(GpioService(self.stations, self.cfg.gpio))
        return adapters

    # ---- service ----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        lock = self.update_lock
        for station in self.stations:
            if lock is not None:
                station.watch(functools.partial(lock.changed, station.name))
            station.start()
        for adapter in self.adapters:
            adapter.start()

    def stop(self) -> None:
        for adapter in reversed(self.adapters):
            try:
                adapter.stop()
            except Exception:  # stop the rest whatever one adapter does
                log.exception("line I/O: stopping %s failed", type(adapter).__name__)
        for station in self.stations:
            station.stop()
        if self.update_lock is not None:
            self.update_lock.close()
        self.jobs.close()

    def threads(self) -> list[Any]:
        threads: list[Any] = list(self.jobs.threads())  # the job store's writer
        for part in [*self.stations, *self.adapters]:
            threads += part.threads() if hasattr(part, "threads") else []
        return threads

    def status(self) -> dict[str, Any]:
        """Each station's signals and counters, each adapter's health (status page, /metrics)."""
        stations = []
        for station in self.stations:
            health = station.health()
            signals = {k: (int(v) if k == "result" else v) for k, v in vars(station.signals()).items()}
            stations.append({"name": station.name, "camera": station.cfg.camera, "signals": signals,
                             "fault": health.detail or None, "counters": health.counters})
        adapters = {}
        for adapter in self.adapters:
            h = adapter.health()
            adapters[adapter.name] = {"ok": h.ok, "detail": h.detail, "counters": h.counters}
        # Line I/O's own threads (the job store's writer first): alive, and restarts after a fault.
        threads = {t.name: t.status() for t in self.threads()}
        return {"enabled": True, "stations": stations, "adapters": adapters, "threads": threads,
                "job_store": {"fault": self.jobs.fault()}}

    # ---- the capture side of a station ----------------------------------------------------------

    def _start_job(self, job: JobRequest, on_acquired: Callable[[], None]) -> Future[Result]:
        daemon = self._daemon
        rig = daemon.rigs.get(job.camera)
        if rig is None:
            raise EdgeRuntimeError(f"camera {job.camera!r} is not running")
        if daemon.journal.refusing():
            raise StorageFull("disk full: the journal cannot store results")

        def tag(request: InspectionRequest) -> None:
            request.schema = job.schema  # the recipe's verdict schema (None: the bundle's)
            request.program = job.program  # the recipe's or station's program (None: the camera's)
            request.line = LineTag(job.station, job.part_id, job.recipe, job.seq)  # back on the result

        return rig.schedule.capture_for_line(job.prompt, job.deadline, lambda _frame: on_acquired(), tag).future

    def notify(self, result: Result) -> None:
        """Sink: a journaled verdict; a line job's goes to its station (which returns at once)."""
        if result.station is None:
            return
        for station in self.stations:
            station.notify(result)

    def health(self) -> SinkHealth:
        faults = [f"job store: {fault}" for fault in [self.jobs.fault()] if fault]  # durable writes first
        faults += [f"{s.name}: {s.fault_reason()}" for s in self.stations if s.fault_reason()]
        faults += [f"{a.name}: {a.health().detail}" for a in self.adapters if not a.health().ok]
        return SinkHealth(ok=not faults, detail="; ".join(faults)[:300])

    def _warm_for(self, camera: str) -> Callable[[], bool]:
        def warm() -> bool:
            inspector, rig = self._daemon.inspector, self._daemon.rigs.get(camera)
            return bool(inspector is not None and inspector.ready and rig is not None
                        and rig.camera.state != CameraState.CONNECTING)
        return warm

    def _fault_for(self, camera: str) -> Callable[[], str | None]:
        def fault() -> str | None:
            daemon = self._daemon
            if daemon.journal.full:
                return "disk full: the journal cannot store results"
            rig = daemon.rigs.get(camera)
            if rig is not None and rig.camera.state in _DOWN:
                return f"camera {camera} is {rig.camera.state.value}" + \
                    (f": {rig.camera.last_error}" if rig.camera.last_error else "")
            return None
        return fault
