"""`reload()`: SIGHUP, the MQTT and REST commands re-read the config file and apply what they can in
place (config/changes.py says what), reload the model only when its settings changed, and name what
needs a restart."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_runtime.api import ApiServer
from edge_runtime.app.running import Running
from edge_runtime.capture.rig import clip_of, stop_rigs
from edge_runtime.config import CameraConfig, Config, load_config
from edge_runtime.config.changes import Changes, describe_changes, programs_changed, restart_only
from edge_runtime.config.reload_guard import refusal
from edge_runtime.core import systemd
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.delivery.mqtt.client import MqttService
from edge_runtime.inference.anomaly.loading import CameraGate
from edge_runtime.inference.anomaly.step import GateStep, gates_for
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.memory_fit import references_check
from edge_runtime.verdicts.journal import Journal
from edge_runtime.verdicts.stage import VerdictServices

log = logging.getLogger("edge_runtime.app.daemon")  # one logger for the daemon's lifecycle lines
GATES_OFF = "anomaly gates off (they do not fit the new model): "  # the health reason's prefix


class Reloader:
    """Applies a re-read config file to the parts it is given; `running` is the state it replaces."""

    def __init__(self, running: Running, config_path: Path | None, *, extra_cameras: list[CameraConfig],
                 journal: Journal, verdicts: VerdictServices, gates: GateStep, faults: set[str],
                 api: ApiServer | None, mqtt: MqttService | None, load_inspector: Callable[[Config], Inspector],
                 start_camera: Callable[[CameraConfig], None]) -> None:
        self.running = running
        self.config_path = config_path
        self.extra_cameras = extra_cameras  # cameras the command line added beyond the file: kept
        self.journal = journal
        self.verdicts = verdicts
        self.gates = gates
        self.faults = faults
        self.api = api
        self.mqtt = mqtt
        self.load_inspector = load_inspector
        self.start_camera = start_camera
        self._lock = threading.Lock()

    def reload(self) -> dict[str, Any]:
        """Re-read the config file: cameras change in place; the model reloads only if it changed.
        Returns what happened: `applied` (changed settings now in effect) and `restart_needed`."""
        with self._lock:  # SIGHUP and the MQTT command may race
            return self._reload_locked()

    def _reload_locked(self) -> dict[str, Any]:
        state = self.running
        if self.config_path is None:
            log.info("daemon: reload requested but no config file was given; nothing to do")
            return {"applied": [], "restart_needed": []}
        systemd.notify("RELOADING=1")
        new, gates = self._read(self.config_path)
        running_file = state.file_config
        state.file_config = new  # what the next reload is compared with (before command-line cameras)
        if self.extra_cameras:
            names = {c.name for c in new.cameras}
            new = new.model_copy(update={"cameras": new.cameras + [
                c for c in self.extra_cameras if c.name not in names]})
        changes = describe_changes(state.config, new)
        new = restart_only(state.config, new)  # settings that need a restart keep their running value
        if new.model != state.config.model or new.device_id != state.config.device_id:
            new = self._swap_model(new, changes)  # the new model loads the programs; failed, it keeps the old
        if new.model == state.config.model and new.device_id == state.config.device_id \
                and state.inspector is not None and (programs_changed(state.config, new)
                                                     or state.inspector.changed_references()):
            # The running model (no new one, or one that failed to load) runs the new programs.
            new = self._use_programs(state.inspector, new, changes, running_file)
        banks = {name: _bank_id(cam) for name, cam in self.gates.cameras.items()}
        self._install_gates(new, gates)
        # Banks are read again on every reload: one fitted again in place (same path, same settings) is
        # in use now, and the reply says so.
        for name, cam in self.gates.cameras.items():
            if name in banks and banks[name] != _bank_id(cam):
                station, _, recipe = name.partition("/")
                key = (f"line_io.stations.{station}.recipes.{recipe}.gate.bank" if recipe
                       else f"cameras.{name}.gate.bank")
                if key not in changes.applied:
                    changes.applied.append(key)
        new_cams = {c.name: c for c in new.cameras}
        going = [name for name, cfg in {c.name: c for c in state.config.cameras}.items()
                 if new_cams.get(name) != cfg and name in state.rigs]
        rigs = dict(state.rigs)
        stopped = [rigs.pop(name) for name in going]
        state.rigs = rigs
        stop_rigs(stopped)  # together: one 3 s wait however many capture threads are stuck in a read
        for name in going:
            log.info("daemon: camera %s %s", name, "changed" if name in new_cams else "removed")
        self.journal.set_limits(new.journal.max_rows, new.journal.max_age_days, new.journal.min_free_mb)
        logging.getLogger().setLevel(new.log_level.upper())
        state.config = new
        for rig in state.rigs.values():  # a program's clip changed under a running camera: a new ring
            rig.schedule.use_clip(clip_of(new, rig.cfg))
        self.verdicts.reload(new.rules, new.rules_budget)
        if self.api is not None and (restart := self.api.apply(new.api)):
            log.warning("daemon: api settings %s change only after a restart", ", ".join(restart))
        for name, cfg in new_cams.items():
            if name not in state.rigs:
                self.start_camera(cfg)
        if self.mqtt is not None:
            self.mqtt.publish_discovery()
        log.info("daemon: config reloaded (%d cameras); applied: %s; need a restart: %s", len(state.rigs),
                 ", ".join(changes.applied) or "nothing", ", ".join(changes.restart_needed) or "nothing")
        systemd.notify("READY=1")
        return {"applied": changes.applied, "restart_needed": changes.restart_needed}

    def _read(self, path: Path) -> tuple[Config, dict[str, CameraGate | None] | None]:
        """The file, refused (one line, the running config kept) when unreadable or weakening, with its
        gates' banks loaded against the running model (a bank that does not fit refuses the file); None
        when the model changes: a new model's gates are loaded with it."""
        state = self.running
        try:
            new = load_config(path)
            extra = {c.name for c in self.extra_cameras}
            why = refusal(state.file_config, new, [c.name for c in state.file_config.cameras if c.name not in extra])
            if why:
                raise EdgeRuntimeError(f"{path}: {why}")
            same_model = state.inspector is not None and new.model == state.config.model
            gates = gates_for(state.inspector.bundle, new) if same_model and state.inspector is not None else None
        except Exception as exc:  # noqa: BLE001 - any unreadable or weakening file: one line, keep running
            log.error("daemon: reload refused, keeping the running config: %s", exc)
            systemd.notify("READY=1")
            raise EdgeRuntimeError(f"reload refused, keeping the running config: {exc}") from None
        return new, gates

    def _swap_model(self, new: Config, changes: Changes) -> Config:
        """Load the new model and close the old one; if it fails, keep the old model's settings."""
        state = self.running
        log.info("daemon: model settings changed; loading the new model")
        try:
            fresh = self.load_inspector(new)
        except EdgeRuntimeError as exc:
            log.error("daemon: new model failed to load, keeping the old one: %s", exc)
            # Not applied after all: the reply and the log line must not say they were.
            changes.applied = [k for k in changes.applied if not (k.startswith("model.") or k == "device_id")]
            return new.model_copy(update={"model": state.config.model, "device_id": state.config.device_id})
        # The old model's banks never score the new encoder's frames: no gate until _install_gates loads the
        # new model's (the frames in between go to the language model).
        self.gates.install({})
        old, state.inspector = state.inspector, fresh
        if old is not None:
            old.close()  # waits for the inspection in progress (inspector lock)
        return new

    def _use_programs(self, inspector: Inspector, new: Config, changes: Changes, file_config: Config) -> Config:
        """Encode the programs' references again (through the encoder cache: unchanged ones are not).
        Programs that cannot run refuse the reload (EdgeRuntimeError) before anything is applied;
        `file_config` is then what the next reload is compared with again."""
        files = inspector.changed_references()  # a reference file replaced under the same config
        try:
            inspector.use_programs(new.programs, new.cameras, new.images, new.line_io.stations,
                                   references_check(inspector.bundle, new))
        except EdgeRuntimeError as exc:
            # The whole file is refused, as `config validate` refuses it: kept, its cameras would run
            # under programs that cannot fit them (a camera grown under an unchanged program, or one
            # switched to a program that was not loaded), so every frame would fail.
            log.error("daemon: reload refused, keeping the running config: %s", exc)
            self.running.file_config = file_config
            systemd.notify("READY=1")
            raise EdgeRuntimeError(f"reload refused, keeping the running config: {exc}") from None
        changes.applied += [f for f in files if f not in changes.applied]
        return new

    def _install_gates(self, new: Config, gates: dict[str, CameraGate | None] | None) -> None:
        """The gates of `new` (loaded for a new model here). A configured gate a new model turned off stays
        visible: a health reason (degraded) until a reload loads the gates again."""
        for fault in [f for f in list(self.faults) if f.startswith(GATES_OFF)]:  # list(): other threads add
            self.faults.discard(fault)
        inspector = self.running.inspector
        if gates is None and inspector is not None:
            try:
                gates = gates_for(inspector.bundle, new)
            except EdgeRuntimeError as exc:
                log.error("daemon: the anomaly gates do not fit the new model and are off: %s", exc)
                self.faults.add(f"{GATES_OFF}{exc}")
                gates = {}
        self.gates.install(gates or {})


def _bank_id(cam: CameraGate) -> tuple[str, ...]:
    """The sha256 of each section of a gate's bank: what tells a bank fitted again from the one in use."""
    return tuple(r.gate.header.vectors.sha256 for r in cam.regions) or (cam.gate.header.vectors.sha256,)
