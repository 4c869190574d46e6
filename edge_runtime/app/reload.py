"""What a config reload can apply in place, and what only a restart applies.

A reload applies every setting it can and names the rest, so "config reloaded" never hides a setting
that silently kept its old value (a rotated API token that still let the old one in).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Protocol, cast

from pydantic import BaseModel

from edge_runtime.api import ApiServer
from edge_runtime.app.reload_guard import refusal
from edge_runtime.capture.rig import CameraRig, clip_of
from edge_runtime.config import CameraConfig, Config, load_config
from edge_runtime.core import systemd
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.delivery.mqtt.client import MqttService
from edge_runtime.inference.anomaly.step import GateStep, gates_for
from edge_runtime.inference.inspector import Inspector
from edge_runtime.verdicts.journal import Journal
from edge_runtime.verdicts.stage import VerdictServices

log = logging.getLogger("edge_runtime.app.daemon")  # one logger for the daemon's lifecycle lines
GATES_OFF = "anomaly gates off (they do not fit the new model): "  # the health reason's prefix

# Settings (dotted prefixes) the running daemon picks up on reload. Everything else is built once at
# start (broker connection, HTTP server, queue, governor, journal file) and needs a restart.
LIVE = (
    "cameras", "model", "device_id",  # cameras restart in place; the model reloads (app.py)
    "log_level", "images", "inspection.jpeg_quality",
    "journal.max_rows", "journal.max_age_days", "journal.min_free_mb",
    "api.token",  # rotated by the API server on reload (api/)
    "api.allow_remote_image_urls", "api.allow_local_image_urls", "api.request_timeout_s",
    "api.auth", "api.request_deadline_s", "api.connections_per_client",  # read per request / accept
    "ota",  # read by the update agent, a separate process
    "rules", "rules_budget",  # re-evaluated from the next verdict on (verdicts.py)
    "rails",  # read per request by the API (api/rails/live.py)
    "api.max_images_per_request", "api.max_request_pixels",  # read per request (api/openai.py)
    "programs",  # references encoded again through the encoder cache (inspector.use_programs)
)


@dataclass
class Changes:
    applied: list[str]
    restart_needed: list[str]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _is_live(key: str) -> bool:
    return any(key == p or key.startswith(p + ".") for p in LIVE)


def _top(key: str) -> str:
    """Cameras are reported as one setting: the list's items have no stable dotted names."""
    return "cameras" if key.startswith("cameras") else key


def _programs_changed(old: Config, new: Config) -> bool:
    """Whether the inspection programs, or which camera runs which, differ."""
    return old.programs != new.programs or ({c.name: c.program for c in old.cameras}
                                            != {c.name: c.program for c in new.cameras})


def describe_changes(old: Config, new: Config) -> Changes:
    """Changed settings, split into those a reload applies and those that need a restart."""
    a, b = _flatten(old.model_dump()), _flatten(new.model_dump())
    changed = sorted({_top(k) for k in a.keys() | b.keys() if a.get(k) != b.get(k)})
    return Changes([k for k in changed if _is_live(k)], [k for k in changed if not _is_live(k)])


def restart_only(old: Config, new: Config) -> Config:
    """`new`, with every restart-only setting kept at its running value (so status tells the truth).

    Built by copying validated objects, not by dumping and re-validating: a round trip through
    `model_dump()` turns unset options into explicit nulls that some validators (rules) refuse.
    """
    merged: Any = new
    for key in describe_changes(old, new).restart_needed:
        merged = _keep(merged, old, key.split("."))
    return cast(Config, merged)


def _keep(new: Any, old: Any, path: list[str]) -> Any:
    """`new` with the value at `path` taken from `old` (through pydantic models and dicts)."""
    head, *rest = path
    if isinstance(new, BaseModel):
        value = getattr(old, head) if not rest else _keep(getattr(new, head), getattr(old, head), rest)
        return new.model_copy(update={head: value})
    if isinstance(new, dict):
        if head not in old:
            return {k: v for k, v in new.items() if k != head}
        return {**new, head: old[head] if not rest or head not in new else _keep(new[head], old[head], rest)}
    return old  # a list or a leaf: keep the running value whole


class ReloadHost(Protocol):
    """What the mixin needs of the class it is mixed into (`app.Daemon`); mypy checks each use."""

    config: Config
    config_path: Any
    file_config: Config
    extra_cameras: list[CameraConfig]
    inspector: Inspector | None
    journal: Journal
    verdicts: VerdictServices
    api: ApiServer | None
    mqtt: MqttService | None
    rigs: dict[str, CameraRig]
    gates: GateStep
    faults: set[str]
    _reload_lock: threading.Lock

    def _reload_locked(self) -> dict[str, Any]: ...

    def _load_inspector(self, config: Config) -> Inspector: ...

    def _start_camera(self, cfg: CameraConfig) -> None: ...


class Reloading:
    """Mixed into `app.Daemon`: `reload()` (SIGHUP, the MQTT and REST commands) applies what it can
    in place, reloads the model only when its settings changed, and names what needs a restart."""

    inspector: Inspector | None  # replaced by a reload that changes the model

    def reload(self: ReloadHost) -> dict[str, Any]:
        """Re-read the config file: cameras change in place; the model reloads only if it changed.
        Returns what happened: `applied` (changed settings now in effect) and `restart_needed`."""
        with self._reload_lock:  # SIGHUP and the MQTT command may race
            return self._reload_locked()

    def _reload_locked(self: ReloadHost) -> dict[str, Any]:
        if self.config_path is None:
            log.info("daemon: reload requested but no config file was given; nothing to do")
            return {"applied": [], "restart_needed": []}
        systemd.notify("RELOADING=1")
        try:
            new = load_config(self.config_path)
            extra = {c.name for c in self.extra_cameras}
            why = refusal(self.file_config, new, [c.name for c in self.file_config.cameras if c.name not in extra])
            if why:
                raise EdgeRuntimeError(f"{self.config_path}: {why}")
            # The gates' banks against the running model (a bank that does not fit refuses the file);
            # a new model's are loaded with it below.
            same_model = self.inspector is not None and new.model == self.config.model
            gates = gates_for(self.inspector.bundle, new) if same_model and self.inspector is not None else None
        except Exception as exc:  # noqa: BLE001 - any unreadable or weakening file: one line, keep running
            log.error("daemon: reload refused, keeping the running config: %s", exc)
            systemd.notify("READY=1")
            raise EdgeRuntimeError(f"reload refused, keeping the running config: {exc}") from None
        self.file_config = new  # what the next reload is compared with (before command-line cameras)
        if self.extra_cameras:
            names = {c.name for c in new.cameras}
            new = new.model_copy(update={"cameras": new.cameras + [
                c for c in self.extra_cameras if c.name not in names]})
        changes = describe_changes(self.config, new)
        new = restart_only(self.config, new)  # settings that need a restart keep their running value
        if new.model != self.config.model or new.device_id != self.config.device_id:
            log.info("daemon: model settings changed; loading the new model")
            try:
                fresh = self._load_inspector(new)
            except EdgeRuntimeError as exc:
                log.error("daemon: new model failed to load, keeping the old one: %s", exc)
                new = new.model_copy(update={"model": self.config.model, "device_id": self.config.device_id})
                # Not applied after all: the reply and the log line must not say they were.
                changes.applied = [k for k in changes.applied if not (k.startswith("model.") or k == "device_id")]
            else:
                old, self.inspector = self.inspector, fresh
                if old is not None:
                    old.close()  # waits for the inspection in progress (inspector lock)
        elif self.inspector is not None and (_programs_changed(self.config, new)
                                             or self.inspector.changed_references()):
            files = self.inspector.changed_references()  # a reference file replaced under the same config
            try:  # references through the encoder cache: unchanged ones are not encoded again
                self.inspector.use_programs(new.programs, new.cameras, new.images)
            except EdgeRuntimeError as exc:
                log.error("daemon: inspection programs refused, keeping the running ones: %s", exc)
                new = new.model_copy(update={"programs": self.config.programs})
                changes.applied = [k for k in changes.applied if not k.startswith("programs")]
            else:
                changes.applied += [f for f in files if f not in changes.applied]
        # A configured gate turned off by a new model stays visible: a health reason (degraded) until a
        # reload loads the gates again.
        for fault in [f for f in list(self.faults) if f.startswith(GATES_OFF)]:  # list(): other threads add
            self.faults.discard(fault)
        if gates is None and self.inspector is not None:
            try:
                gates = gates_for(self.inspector.bundle, new)
            except EdgeRuntimeError as exc:
                log.error("daemon: the anomaly gates do not fit the new model and are off: %s", exc)
                self.faults.add(f"{GATES_OFF}{exc}")
                gates = {}
        self.gates.install(gates or {})
        old_cams = {c.name: c for c in self.config.cameras}
        new_cams = {c.name: c for c in new.cameras}
        for name, cfg in old_cams.items():
            if new_cams.get(name) != cfg and name in self.rigs:
                rigs = dict(self.rigs)
                rig = rigs.pop(name)
                self.rigs = rigs
                rig.stop()
                log.info("daemon: camera %s %s", name, "changed" if name in new_cams else "removed")
        self.journal.max_rows, self.journal.max_age_s = new.journal.max_rows, new.journal.max_age_days * 86400
        self.journal.min_free_bytes = int(new.journal.min_free_mb * 1024 * 1024)
        logging.getLogger().setLevel(new.log_level.upper())
        self.config = new
        for rig in self.rigs.values():  # a program's clip changed under a running camera: a new ring
            rig.schedule.use_clip(clip_of(new, rig.cfg))
        self.verdicts.reload(new.rules, new.rules_budget)
        if self.api is not None and (restart := self.api.apply(new.api)):
            log.warning("daemon: api settings %s change only after a restart", ", ".join(restart))
        for name, cfg in new_cams.items():
            if name not in self.rigs:
                self._start_camera(cfg)
        if self.mqtt is not None:
            self.mqtt.publish_discovery()
        log.info("daemon: config reloaded (%d cameras); applied: %s; need a restart: %s", len(self.rigs),
                 ", ".join(changes.applied) or "nothing", ", ".join(changes.restart_needed) or "nothing")
        systemd.notify("READY=1")
        return {"applied": changes.applied, "restart_needed": changes.restart_needed}
