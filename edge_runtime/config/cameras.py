"""`cameras:`: each camera's source, region and trigger mode."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from edge_runtime.config.base import NAME, Section, beside_config
from edge_runtime.config.gate import GateConfig

MAX_FRAME_SIDE = 16384  # the largest frame side a camera may have (width, height; a roi or region inside it)


def check_box(box: tuple[int, int, int, int], what: str) -> tuple[int, int, int, int]:
    """`box` ([x, y, width, height]) with x, y >= 0, a pixel at least, and inside the largest frame; else
    ValueError naming `what` (a camera's roi, a program's region)."""
    x, y, w, h = box
    if x < 0 or y < 0 or w < 1 or h < 1 or x + w > MAX_FRAME_SIDE or y + h > MAX_FRAME_SIDE:
        shown = ", ".join(str(v) if abs(v) < 10**9 else f"{str(v)[:6]}..." for v in box)
        raise ValueError(f"{what} [{shown}] needs x, y >= 0, width and height >= 1 and x + width, y + height at "
                         f"most {MAX_FRAME_SIDE} (the largest frame side)")
    return box


class TriggerConfig(Section):
    mode: Literal["interval", "continuous", "on_demand", "on_change"] = Field(
        "interval", description="interval: every interval_s; continuous: as fast as the model allows; "
        "on_demand: only when triggered (REST/MQTT); on_change: when the scene changed.")
    interval_s: float = Field(1.0, ge=0.01, le=86400, description="Seconds between inspections (interval).")
    change_threshold: float = Field(
        0.04, gt=0, le=1, description="on_change: mean absolute difference (0-1) of a 32x32 grey "
        "thumbnail against the last inspected frame that counts as a change.")
    change_check_s: float = Field(0.2, ge=0.01, description="on_change: seconds between comparisons.")


class CsiConfig(Section):
    sensor_id: int = Field(0, ge=0, description="nvarguscamerasrc sensor-id.")
    flip_method: int = Field(0, ge=0, le=7, description="nvvidconv flip-method (0 none, 2 rotate 180).")


class CameraConfig(Section):
    name: str = Field(pattern=NAME, description="Camera name (letters, digits, _ and -): used in topics.")
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
    program: str | None = Field(None, pattern=NAME, description="The inspection program (under programs:) "
                                "whose references go before this camera's frames.")
    remote: bool = Field(False, description="Inspect every frame on the central server (offload:).")
    gate: GateConfig | None = Field(None, description="The anomaly gate in front of the language model for "
                                    "this camera's frames (docs/inspection.md#the-anomaly-gate).")
    trigger: TriggerConfig = Field(default_factory=TriggerConfig, description="When to inspect.")
    open_timeout_s: float = Field(10, gt=0, description="Give up opening a stream after this long.")
    read_timeout_s: float = Field(5, gt=0, description="A stream silent this long counts as failed.")
    reconnect_min_s: float = Field(0.5, gt=0, description="First reconnect delay; doubles each failure.")
    reconnect_max_s: float = Field(30, gt=0, description="Longest reconnect delay.")

    @model_validator(mode="after")
    def _file_source_beside_config(self, info: ValidationInfo) -> CameraConfig:
        # A file or folder source is a path like the others (base.beside_config), `file://` and all (capture
        # strips it and opens the rest); a URL, a GStreamer pipeline or a device index is not (kind auto:
        # capture/sources.source_kind's tests, without the disk).
        src = self.source
        if not isinstance(src, str) or self.kind not in ("auto", "image", "folder", "video"):
            return self
        scheme = "file://" if src.startswith("file://") else ""
        path = src.removeprefix(scheme)
        if "://" in path:
            return self
        if self.kind != "auto" or not ("!" in path or re.fullmatch(r"\d+", path)):
            self.source = scheme + beside_config(path, info)
        return self

    @field_validator("roi")
    @classmethod
    def _roi_in_a_frame(cls, v: tuple[int, int, int, int] | None) -> tuple[int, int, int, int] | None:
        return None if v is None else check_box(v, "roi")
