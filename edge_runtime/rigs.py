"""A running camera and its trigger loop, as the daemon holds them per configured camera."""

from __future__ import annotations

import cv2

from .capture import Camera
from .config import CameraConfig, ImageLimits
from .contracts import Gate
from .contracts import UnknownCamera as UnknownCamera  # re-exported: its old home was app.py
from .scheduler import CameraSchedule, InspectionQueue


class CameraRig:
    """A running camera and its trigger loop."""

    def __init__(self, cfg: CameraConfig, inspections: InspectionQueue, gate: Gate, pipelined: bool,
                 limits: ImageLimits | None = None) -> None:
        self.cfg = cfg
        self.camera = Camera(cfg, limits)  # folder cameras decode with the configured image limits
        self.schedule = CameraSchedule(self.camera, cfg.trigger, cfg.prompt, inspections, gate, pipelined)
        self._jpeg: tuple[int, bytes] | None = None

    def start(self) -> None:
        self.camera.start()
        self.schedule.start()

    def stop(self) -> None:
        self.schedule.stop()
        self.camera.stop()

    def latest_jpeg(self, quality: int) -> bytes | None:
        """The newest frame as JPEG, encoded lazily and cached per frame."""
        frame = self.camera.slot.peek()
        if frame is None:
            return None
        if self._jpeg is None or self._jpeg[0] != frame.seq:
            ok, buf = cv2.imencode(".jpg", frame.image, [cv2.IMWRITE_JPEG_QUALITY, quality])
            if not ok:
                return None
            self._jpeg = (frame.seq, buf.tobytes())
        return self._jpeg[1]
