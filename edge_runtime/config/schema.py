"""The YAML configuration: pydantic models, `${ENV}` substitution, errors that name key and line.

A missing file means defaults that run on a fresh machine (the demo bundle, CPU, loopback API).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from edge_runtime.config.loader import Expander, line_of
from edge_runtime.config.offload import OffloadConfig
from edge_runtime.config.rules import Rule, RulesBudget, validate_rules
from edge_runtime.core.errors import ConfigError

DEFAULT_PROVIDERS = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Section):
    path: Path | None = Field(
        None, description="Model bundle folder. Empty: the demo bundle, built on first use.")
    threads: int = Field(
        default_factory=lambda: os.cpu_count() or 1, ge=1, le=256,
        description="CPU threads for llama.cpp and ONNX Runtime (default: all cores).")
    context_size: int = Field(2048, ge=256, le=131072, description="llama.cpp context (tokens).")
    batch_size: int = Field(512, ge=32, le=8192, description="llama.cpp batch size (tokens per decode).")
    gpu_layers: int = Field(0, ge=-1, description="Layers offloaded to the GPU; -1 offloads all.")
    kv_cache_type: Literal["f16", "f32"] = Field(
        "f16", description="llama.cpp KV cache precision: f16 halves its memory; f32 matches a float32 "
        "reference implementation to ~1e-5 (docs/models.md).")
    providers: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROVIDERS),
        description="ONNX Runtime execution providers in order of preference; missing ones are skipped.")
    vision_precision: Literal["fp32", "fp16"] = Field(
        "fp32", description="fp16 loads the bundle's half-precision encoder (for CUDA/TensorRT); "
        "bundles without one keep fp32.")
    prompt: str | None = Field(None, description="Inspection question; empty uses the bundle's default.")
    max_tokens: int | None = Field(None, ge=1, le=8192,
                                   description="Verdict token limit; empty uses the bundle's.")
    reuse_prefix_cache: bool = Field(
        True, description="Keep the KV cache of the fixed prompt prefix between inspections.")
    verify_checksums: bool = Field(True, description="Check the bundle's sha256 sums at load.")
    warmup: bool = Field(True, description="Run one inspection at load so the first real one is fast.")
    constraint_engine: Literal["llguidance", "gbnf"] = Field(
        "llguidance", description="JSON constraint engine: llguidance (token masks in Rust, only when the "
        "best token is refused; forced tokens in one batch) or gbnf (llama.cpp's grammar sampler).")
    fast_forward: bool = Field(
        True, description="llguidance: decode the tokens the grammar forces in one batch. Off: one token "
        "per step, exactly the tokens greedy decoding picks (docs/benchmarks.md).")
    batch_kv_cache: Literal["per_sequence", "unified"] = Field(
        "per_sequence", description="KV cache of cameras generated as parallel sequences: per_sequence "
        "gives each its own stream (verdicts bit-identical to one at a time); unified shares one buffer "
        "(~15% more batched tokens/s on a 1.5B model, but verdicts may differ from one at a time).")
    token_cache_bytes: int = Field(
        4 * 1024 * 1024, ge=0, le=1 << 30,
        description="Memory for tokenized prompt texts kept between inspections (bytes; LRU).")


class ImageLimits(_Section):
    max_pixels: int = Field(50_000_000, ge=1, description="Refuse images declaring more pixels.")
    min_side: int = Field(16, ge=1, description="Refuse images with a side shorter than this.")
    max_file_mb: float = Field(64, gt=0, le=4096, description="Refuse image files larger than this "
                               "(camera folders, the CLI) before reading them.")


# Names end up in MQTT topics, URLs and file names: anchored, so `#`, `+`, `/`, markup and
# 100-character names are refused (an unanchored pattern let `line#1` through and wedged the outbox).
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$"
_DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # host names carry dots
_TOPIC_PIECE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_CONFIG_BYTES = 1 << 20  # a config is a few KB; anything near this is not one


def _check_topic(value: str, what: str) -> str:
    """A topic prefix: 1-8 `/`-separated pieces, each safe in topics, URLs and file names."""
    pieces = value.rstrip("/").split("/")
    if len(pieces) > 8 or not all(_TOPIC_PIECE.fullmatch(p) for p in pieces):
        raise ValueError(f"{what}: use up to 8 '/'-separated pieces of 1-64 letters, digits, '_', '.' "
                         "or '-' (no MQTT wildcards '#' or '+', no empty piece)")
    return value


class TriggerConfig(_Section):
    mode: Literal["interval", "continuous", "on_demand", "on_change"] = Field(
        "interval", description="interval: every interval_s; continuous: as fast as the model allows; "
        "on_demand: only when triggered (REST/MQTT); on_change: when the scene changed.")
    interval_s: float = Field(1.0, ge=0.01, le=86400, description="Seconds between inspections (interval).")
    change_threshold: float = Field(
        0.04, gt=0, le=1, description="on_change: mean absolute difference (0-1) of a 32x32 grey "
        "thumbnail against the last inspected frame that counts as a change.")
    change_check_s: float = Field(0.2, ge=0.01, description="on_change: seconds between comparisons.")


class CsiConfig(_Section):
    sensor_id: int = Field(0, ge=0, description="nvarguscamerasrc sensor-id.")
    flip_method: int = Field(0, ge=0, le=7, description="nvvidconv flip-method (0 none, 2 rotate 180).")


class CameraConfig(_Section):
    name: str = Field(pattern=_NAME, description="Camera name (letters, digits, _ and -): used in topics.")
    source: str | int = Field(description="File, folder, /dev/videoN or index, rtsp://, http(s):// MJPEG "
                              "URL, or a GStreamer pipeline.")
    kind: Literal["auto", "image", "folder", "video", "v4l2", "rtsp", "http", "gstreamer", "csi"] = Field(
        "auto", description="Source type; auto guesses from the source string. csi builds the Jetson "
        "nvarguscamerasrc pipeline.")
    enabled: bool = Field(True, description="Set false to keep a camera configured but not running.")
    loop: bool = Field(True, description="Files and folders start over at the end.")
    fps: float | None = Field(None, gt=0, le=240, description="Frame rate requested from V4L2/CSI, or "
                              "the pace at which files are played (default: the file's own).")
    width: int | None = Field(None, ge=16, le=16384, description="Requested capture width (V4L2/CSI).")
    height: int | None = Field(None, ge=16, le=16384, description="Requested capture height (V4L2/CSI).")
    fourcc: str | None = Field(None, min_length=4, max_length=4, description="V4L2 pixel format, e.g. MJPG.")
    csi: CsiConfig = Field(default_factory=CsiConfig, description="Jetson CSI camera options.")
    rtsp_transport: Literal["tcp", "udp"] = Field("tcp", description="RTSP transport (tcp survives loss).")
    roi: tuple[int, int, int, int] | None = Field(
        None, description="Region of interest [x, y, width, height] cropped before inspection.")
    prompt: str | None = Field(None, description="Inspection question for this camera.")
    remote: bool = Field(False, description="Inspect every frame on the central server (offload:).")
    trigger: TriggerConfig = Field(default_factory=TriggerConfig, description="When to inspect.")
    open_timeout_s: float = Field(10, gt=0, description="Give up opening a stream after this long.")
    read_timeout_s: float = Field(5, gt=0, description="A stream silent this long counts as failed.")
    reconnect_min_s: float = Field(0.5, gt=0, description="First reconnect delay; doubles each failure.")
    reconnect_max_s: float = Field(30, gt=0, description="Longest reconnect delay.")


class JournalConfig(_Section):
    path: Path | None = Field(None, description="SQLite file (default: <data_dir>/journal.sqlite3).")
    max_rows: int = Field(100_000, ge=10, description="Keep at most this many delivered results.")
    max_age_days: float = Field(30, gt=0, description="Delete delivered results older than this.")
    min_free_mb: float = Field(64, ge=0, description="Free-space watermark: below it the oldest delivered "
                               "results are deleted early, so the disk does not fill.")


class InspectionConfig(_Section):
    queue_size: int = Field(4, ge=1, le=256, description="Inspections waiting for the model; beyond this "
                            "cameras skip frames and the API answers 429.")
    jpeg_quality: int = Field(80, ge=10, le=100, description="Quality of the latest-frame JPEG per camera.")
    overlap_stages: bool = Field(True, description="Encode the next frame while the language model generates "
                                 "the current verdict (two pipeline stages).")
    max_batch: int = Field(4, ge=1, le=32, description="Frames of different cameras that are ready together "
                           "are generated as parallel sequences of one llama.cpp batch, up to this many.")


class TlsConfig(_Section):
    enabled: bool = Field(False, description="Connect over TLS.")
    ca_file: Path | None = Field(None, description="CA bundle that signed the broker's certificate "
                                 "(default: the system store).")
    cert_file: Path | None = Field(None, description="Client certificate for mutual TLS.")
    key_file: Path | None = Field(None, description="Client private key for mutual TLS.")
    insecure: bool = Field(False, description="Skip broker hostname verification (testing only).")


class HomeAssistantConfig(_Section):
    enabled: bool = Field(False, description="Publish Home Assistant MQTT discovery configs.")
    discovery_prefix: str = Field("homeassistant", description="Home Assistant's discovery prefix.")

    @field_validator("discovery_prefix")
    @classmethod
    def _topic_safe(cls, v: str) -> str:
        return _check_topic(v, "discovery prefix")


class MqttConfig(_Section):
    enabled: bool = Field(True, description="Publish results over MQTT (the daemon runs without a broker).")
    host: str = Field("localhost", description="Broker host name or address.")
    port: int = Field(1883, ge=1, le=65535, description="Broker port (8883 is usual for TLS).")
    client_id: str | None = Field(None, description="Client id (default: edge-runtime-<device_id>).")
    keepalive: int = Field(30, ge=5, le=3600, description="Seconds between keep-alive pings.")
    clean_session: bool = Field(True, description="false keeps the broker-side session (and the "
                                "command subscription) across reconnects.")
    username: str | None = Field(None, description="Broker user name.")
    password: SecretStr | None = Field(None, description="Broker password; use ${ENV} or a systemd "
                                       "credential, never plain text. Never logged.")
    tls: TlsConfig = Field(default_factory=TlsConfig, description="TLS settings.")
    topic_prefix: str | None = Field(None, description="Topic prefix (default: edge/<device_id>).")
    qos: Literal[0, 1, 2] = Field(1, description="QoS of result messages.")
    max_inflight: int = Field(20, ge=1, le=1000, description="Results published but not yet acknowledged.")
    telemetry_interval_s: float = Field(10, ge=1, description="Seconds between telemetry messages.")
    homeassistant: HomeAssistantConfig = Field(default_factory=HomeAssistantConfig,
                                               description="Home Assistant discovery.")

    @field_validator("topic_prefix")
    @classmethod
    def _topic_safe(cls, v: str | None) -> str | None:
        return v if v is None else _check_topic(v, "topic prefix")


class ApiConfig(_Section):
    enabled: bool = Field(True, description="Serve the REST API, OpenAI endpoint, metrics and status page.")
    host: str = Field("0.0.0.0", description="Bind address; 127.0.0.1 keeps everything on the device.")
    port: int = Field(8080, ge=0, le=65535, description="TCP port (0 picks a free one).")
    token: SecretStr | None = Field(
        None, description="Bearer token for inference and mutating endpoints (and every read with "
        "auth: all). Without one, those endpoints answer only clients on loopback.")
    auth: Literal["writes", "all"] = Field(
        "writes", description="What needs the token: writes (inference and changes; reads are open) or "
        "all (every endpoint but /healthz, /readyz and the status page's shell and static files).")
    threads: int = Field(6, ge=2, le=64, description="WSGI worker threads (live event streams hold one each).")
    max_request_mb: float = Field(16, gt=0, le=512, description="Largest accepted request body.")
    allow_remote_image_urls: bool = Field(
        False, description="Let /v1/chat/completions fetch http(s) image URLs (data: URLs always work).")
    request_timeout_s: float = Field(60, gt=0, description="How long an API request waits for its verdict.")
    request_deadline_s: float = Field(
        15, ge=0.5, le=600, description="A request's head and body must arrive within this many seconds "
        "of its first byte, or the connection gets a 408 and is closed (slow-sending clients).")
    connections_per_client: int = Field(
        64, ge=1, le=500, description="Most connections one client address may hold open; more are "
        "refused at once. 127.0.0.1 and ::1 are exempt (local health checks).")


class JetsonActions(_Section):
    jetson_clocks_off: bool = Field(False, description="Turn jetson_clocks off when throttling (needs the "
                                    "jtop service and permission).")
    low_power_mode: int | str | None = Field(None, description="nvpmodel mode to switch to at minimal/paused.")
    normal_power_mode: int | str | None = Field(None, description="nvpmodel mode to restore at normal.")


class GovernorConfig(_Section):
    enabled: bool = Field(True, description="Hold the thermal and power budget.")
    sensor: Literal["auto", "jtop", "nvml", "sysfs", "replay", "none"] = Field(
        "auto", description="Sensor backend; auto tries jtop, NVML, then sysfs.")
    replay_file: Path | None = Field(None, description="Recorded trace (JSONL or CSV) for sensor: replay.")
    interval_s: float = Field(1.0, ge=0.1, le=60, description="Seconds between sensor readings.")
    max_temp_c: float | None = Field(None, description="Hottest sensor limit; empty: the lowest trip "
                                     "point read at run time minus trip_margin_c.")
    trip_margin_c: float = Field(10, ge=0, description="Stay this far below the lowest trip point.")
    emergency_margin_c: float = Field(5, gt=0, description="This far over the limit pauses at once.")
    temp_hysteresis_c: float = Field(5, gt=0, description="Recover only this far below the limit.")
    max_power_w: float | None = Field(None, gt=0, description="Average power budget in watts (empty: none).")
    power_window_s: float = Field(10, gt=0, description="Window of the power average.")
    power_hysteresis: float = Field(0.1, ge=0, lt=1, description="Recover only below budget x (1 - this).")
    step_down_after_s: float = Field(3, ge=0, description="Least time between two steps down.")
    recover_after_s: float = Field(30, gt=0, description="Calm time before a step up; doubles after a "
                                   "step up that did not hold.")
    recover_max_s: float = Field(600, gt=0, description="Longest wait before a step up.")
    reduced_rate: float = Field(0.5, gt=0, le=1, description="Inspection rate factor at the reduced level.")
    minimal_rate: float = Field(0.2, gt=0, le=1, description="Inspection rate factor at the minimal level.")
    jetson_actions: JetsonActions = Field(default_factory=JetsonActions, description="Optional Jetson actions.")


class OtaConfig(_Section):
    container: str = Field("edge-runtime", description="Name of the daemon's container the agent updates.")
    public_keys: list[str] = Field(default_factory=list, description="Trusted fleet keys (base64 Ed25519 "
                                   "public keys); manifests signed by any other key are refused.")
    groups: list[str] = Field(default_factory=list, description="Fleet groups: manifests published to "
                              "edge/group/<name>/cmd/ota also reach this device.")
    manifest_url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=2048,
                                     description="HTTP(S) URL polled for a manifest (besides MQTT).")
    poll_interval_s: float = Field(300, ge=10, description="Seconds between polls of manifest_url.")
    health_timeout_s: float = Field(120, gt=0, description="How long a candidate has to turn healthy.")
    allow_downgrade: bool = Field(False, description="Accept manifests whose version is not newer.")
    state_dir: Path | None = Field(None, description="Where the agent keeps its state (default <data_dir>/ota).")


# The evidence store's section (evidence.py); here so that reading a config never imports OpenCV.
class EvidenceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Keep the image each verdict was made from.")
    path: Path | None = Field(None, description="Folder of the store (default: <data_dir>/evidence).")
    max_mb: float = Field(1024, gt=0, description="Disk budget of the store (images and thumbnails).")
    max_age_days: float = Field(30, gt=0, description="Delete delivered evidence older than this.")
    min_free_mb: float = Field(64, ge=0, description="Leave this much free on the file system "
                               "(the journal shares it): older evidence is deleted first.")
    keep_passes: float = Field(0.1, ge=0, le=1, description="Fraction of passing verdicts whose image "
                               "is kept (defects are always kept); 0 keeps none, 1 keeps all.")
    defect_field: str = Field("defect", pattern=r"^[A-Za-z0-9_]{1,64}$",
                              description="Verdict field that is true for a defect.")
    full_frame: bool = Field(False, description="Keep the whole camera frame instead of the ROI crop "
                             "the model saw.")
    jpeg_quality: int = Field(85, ge=10, le=100, description="JPEG quality of kept images.")
    thumbnail_px: int = Field(192, ge=32, le=1024, description="Longest side of thumbnails.")


class Config(_Section):
    device_id: str = Field(default_factory=socket.gethostname,
                           description="Name of this device in results, topics and metrics.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    data_dir: Path = Field(
        default_factory=lambda: default_data_dir(),
        description="Where the journal and the demo bundle live.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The vision-language model.")
    images: ImageLimits = Field(default_factory=ImageLimits, description="Limits on input images.")
    cameras: list[CameraConfig] = Field(default_factory=list, description="Cameras to inspect.")
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
    rules: list[Rule] = Field(default_factory=list, max_length=100, description="Rules evaluated on every "
                              "verdict (docs/inspection.md).")
    rules_budget: RulesBudget = Field(default_factory=RulesBudget, description="What all rules together may "
                                      "cost per verdict and per minute (re-asks, regex time).")

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
        return self

    @model_validator(mode="after")
    def _remote_needs_offload(self) -> Config:
        if any(c.remote for c in self.cameras) and not self.offload.enabled:
            raise ValueError("cameras with remote: true need offload.enabled and offload.endpoints")
        return self

    def topic_prefix(self) -> str:
        return (self.mqtt.topic_prefix or f"edge/{self.device_id}").rstrip("/")

    def journal_path(self) -> Path:
        return self.journal.path or self.data_dir / "journal.sqlite3"

    @field_validator("device_id")
    @classmethod
    def _topic_safe(cls, v: str) -> str:
        if not _DEVICE_ID.fullmatch(v):
            raise ValueError("use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit "
                             "(it is part of MQTT topics, URLs and file names)")
        return v


def default_data_dir() -> Path:
    import platformdirs

    return Path(os.environ.get("EDGE_RUNTIME_DATA") or platformdirs.user_data_dir("edge-runtime"))


def parse_config(text: str, source: str = "<config>") -> Config:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:  # PyYAML composes recursively: `[[[[...` thousands deep
        raise ConfigError(f"{source}: not valid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    if root is None:
        return Config()
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{source}: the top level must be a mapping of sections (key: value)")
    try:
        data = Expander(source).value(root)
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc)
        line = line_of(root, loc)
        where = f"{source}:{line}" if line else source
        msg = "unknown key (not part of the configuration)" if err["type"] == "extra_forbidden" else err["msg"]
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise ConfigError(f"{where}: {key}: {msg}{more}") from None


def load_config(path: Path | str | None) -> Config:
    """Read a config file; None gives the defaults."""
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
    return parse_config(text, str(path))


def config_schema() -> dict[str, Any]:
    return Config.model_json_schema()
