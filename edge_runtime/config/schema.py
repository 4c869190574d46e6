"""The whole YAML configuration (`Config`), `${ENV}` substitution, and errors that name key and line.

Each section lives in its own module of this folder; a missing file means defaults that run on a
fresh machine (the demo bundle, CPU, loopback API).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from edge_runtime.config.api import ApiConfig
from edge_runtime.config.base import CONFIG_DIR, DEVICE_ID, NAME, RESOLVED, ConfigPath, Section
from edge_runtime.config.cameras import CameraConfig
from edge_runtime.config.governor import GovernorConfig
from edge_runtime.config.inspection import ImageLimits, InspectionConfig
from edge_runtime.config.journal import EvidenceConfig, JournalConfig
from edge_runtime.config.line_io import LineIOConfig, check_defect_code_regions, check_line_programs
from edge_runtime.config.loader import Expander, line_of, shown
from edge_runtime.config.model import ModelConfig
from edge_runtime.config.mqtt import MqttConfig
from edge_runtime.config.offload import OffloadConfig
from edge_runtime.config.ota import OtaConfig
from edge_runtime.config.programs import (
    ProgramConfig,
    check_clip_pace,
    check_clip_ring,
    check_references,
    check_region_schemas,
    check_regions_inside,
)
from edge_runtime.config.rails import RailsConfig
from edge_runtime.config.rules import Rule, RulesBudget, validate_rules
from edge_runtime.core.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20  # a config is a few KB; anything near this is not one


# The camera names of results that no camera made: POST /api/v1/infer ("api") and chat ("openai").
RESERVED_CAMERA_NAMES = frozenset({"api", "openai"})


class Config(Section):
    device_id: str = Field(default_factory=socket.gethostname,
                           description="Name of this device in results, topics and metrics.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    data_dir: ConfigPath = Field(
        default_factory=lambda: default_data_dir(),
        description="Where the journal and the demo bundle live.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The vision-language model.")
    images: ImageLimits = Field(default_factory=ImageLimits, description="Limits on input images.")
    # A device runs a capture and a schedule thread per camera: a runaway generated file is refused.
    cameras: list[CameraConfig] = Field(default_factory=list, max_length=64, description="Cameras to inspect "
                                        "(at most 64).")
    inspection: InspectionConfig = Field(default_factory=InspectionConfig,
                                         description="The shared inspection queue.")
    journal: JournalConfig = Field(default_factory=JournalConfig, description="The result journal.")
    mqtt: MqttConfig = Field(default_factory=MqttConfig, description="MQTT broker connection.")
    api: ApiConfig = Field(default_factory=ApiConfig, description="The local HTTP API and status page.")
    governor: GovernorConfig = Field(default_factory=GovernorConfig, description="Thermal/power governor.")
    ota: OtaConfig = Field(default_factory=OtaConfig, description="The over-the-air update agent.")
    offload: OffloadConfig = Field(default_factory=OffloadConfig,
                                   description="Offload and escalation to central servers (docs/scale-out.md).")
    evidence: EvidenceConfig = Field(default_factory=EvidenceConfig, description="Images kept with verdicts.")
    programs: dict[str, ProgramConfig] = Field(
        default_factory=dict, max_length=64, description="Inspection programs by name (references before the "
        "frame); a camera names one with `program` (docs/inspection.md).")
    rules: list[Rule] = Field(default_factory=list, max_length=100, description="Rules evaluated on every "
                              "verdict (docs/inspection.md).")
    rules_budget: RulesBudget = Field(default_factory=RulesBudget, description="What all rules together may "
                                      "cost per verdict and per minute (re-asks, regex time).")
    line_io: LineIOConfig = Field(default_factory=LineIOConfig, description="Stations a PLC triggers, and the "
                                  "OPC UA / Modbus TCP / Sparkplug B / GPIO servers (docs/line-io.md).")
    rails: RailsConfig = Field(default_factory=RailsConfig, description="Input and output rails of the OpenAI "
                               "endpoint and REST infer (docs/api.md).")
    _resolved_paths: list[tuple[str, str]] = PrivateAttr(default_factory=list)  # parse_config's (written, read as)

    @field_validator("rules")
    @classmethod
    def _unique_rules(cls, v: list[Rule]) -> list[Rule]:
        return validate_rules(v)

    @model_validator(mode="after")
    def _rules_within_budget(self) -> Config:
        self.rules_budget.check(self.rules)
        return self

    @model_validator(mode="after")
    def _unique_camera_names(self) -> Config:
        names = [c.name for c in self.cameras]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"camera names must be unique; repeated: {', '.join(dupes)}")
        reserved = sorted(set(names) & RESERVED_CAMERA_NAMES)
        if reserved:
            raise ValueError(f"camera name {reserved[0]!r} is reserved: results of REST uploads and chat "
                             "requests carry it")
        return self

    @model_validator(mode="after")
    def _programs_exist_and_read(self) -> Config:
        for name in self.programs:
            if not re.fullmatch(NAME, name):
                raise ValueError(f"programs.{name[:64]}: a program name is 1-48 letters, digits, '_' or '-'")
        users: dict[str, list[str]] = {}
        for cam in self.cameras:
            if cam.program is not None:
                if cam.program not in self.programs:
                    raise ValueError(f"cameras.{cam.name}.program: no program {cam.program!r} under programs:")
                users.setdefault(cam.program, []).append(cam.name)
                clip = self.programs[cam.program].clip
                if clip is not None and cam.trigger.mode == "on_demand":
                    raise ValueError(f"cameras.{cam.name}.trigger.mode: on_demand never asks program {cam.program}'s "
                                     f"clip of {clip.frames} frames (a REST or MQTT trigger asks about one frame; "
                                     "clips are asked by interval, continuous or on_change)")
                if cam.fps is not None:
                    check_clip_pace(self.programs[cam.program], cam.fps, cam.program, cam.name)
                size = (cam.roi[2], cam.roi[3]) if cam.roi else (cam.width, cam.height)
                if size[0] is not None and size[1] is not None:  # else checked per frame (a region has no verdict)
                    check_regions_inside(self.programs[cam.program], size[0], size[1], cam.program, cam.name)
                    check_clip_ring(self.programs[cam.program], size[0], size[1], cam.program, cam.name)
        check_region_schemas(self.programs, users)
        check_references(self.programs, users, self.images)
        check_line_programs(self.line_io.stations, self.programs,
                            {c.name: (c.roi[2], c.roi[3]) if c.roi else (c.width, c.height) for c in self.cameras},
                            {c.name: c.program for c in self.cameras})
        check_defect_code_regions(self.line_io.stations, {c.name: c.program for c in self.cameras}, self.programs)
        return self

    @model_validator(mode="after")
    def _remote_needs_offload(self) -> Config:
        if any(c.remote for c in self.cameras) and not self.offload.enabled:
            raise ValueError("cameras with remote: true need offload.enabled and offload.endpoints")
        return self

    def resolved_paths(self) -> list[tuple[str, str]]:
        """Each relative path of the file it was read from and the path it means there: (written, read as)."""
        return list(self._resolved_paths)

    def topic_prefix(self) -> str:
        return (self.mqtt.topic_prefix or f"edge/{self.device_id}").rstrip("/")

    def journal_path(self) -> Path:
        return self.journal.path or self.data_dir / "journal.sqlite3"

    @field_validator("device_id")
    @classmethod
    def _topic_safe(cls, v: str) -> str:
        if not DEVICE_ID.fullmatch(v):
            raise ValueError("use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit "
                             "(it is part of MQTT topics, URLs and file names)")
        return v


def default_data_dir() -> Path:
    import platformdirs

    return Path(os.environ.get("EDGE_RUNTIME_DATA") or platformdirs.user_data_dir("edge-runtime"))


def parse_config(text: str, source: str = "<config>", config_dir: Path | None = None) -> Config:
    """`text` as a config; its relative paths are read from `config_dir` (the folder of the file it came
    from, base.beside_config), or kept relative to the working directory without one."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:  # PyYAML composes recursively: `[[[[...` thousands deep
        raise ConfigError(f"{source}: not valid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    if root is None or root.tag == "tag:yaml.org,2002:null":
        # 0 bytes, blank lines, comments only, a bare `---`: a file emptied by mistake, never "defaults"
        raise ConfigError(f"{source}: the config file is empty (no settings); leave out --config to run on "
                          "the defaults, or write {} to mean them")
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{source}: the top level must be a mapping of sections (key: value)")
    try:
        data = Expander(source).value(root)
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    try:
        resolved: list[tuple[str, str]] = []
        config = Config.model_validate(data, context={CONFIG_DIR: config_dir, RESOLVED: resolved}
                                       if config_dir is not None else None)
        config._resolved_paths = resolved
        return config
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        key = shown(".".join(str(p) for p in loc), 120)  # keys come from the file: one line, bounded
        line = line_of(root, loc)
        where = f"{source}:{line}" if line else source
        msg = "unknown key (not part of the configuration)" if err["type"] == "extra_forbidden" else err["msg"]
        msg = shown(msg, 300)  # a check's message may quote a name from the file
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        if not key:  # a check of the whole file (programs, names): its message names the field itself
            raise ConfigError(f"{where}: {msg.removeprefix('Value error, ')}{more}") from None
        raise ConfigError(f"{where}: {key}: {msg}{more}") from None


def load_config(path: Path | str | None) -> Config:
    """Read a config file; None gives the defaults. Relative paths in it are read from its folder."""
    if path is None:
        return Config()
    path = Path(path)
    try:
        if not path.exists():
            if path.is_symlink():
                raise ConfigError(f"{path}: cannot be read (broken or looping symbolic link)")
            raise ConfigError(f"{path}: no such config file")
        if not path.is_file():
            raise ConfigError(f"{path}: not a regular file")
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # bounded: /dev/zero or a 10 GB file costs nothing
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 1024} KiB; not a config file")
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if "\x00" in text:
        raise ConfigError(f"{path}: binary data, not a YAML config")
    return parse_config(text, str(path), path.parent.resolve())  # the folder as named (a linked file: its link's)


def config_schema() -> dict[str, Any]:
    return Config.model_json_schema()
