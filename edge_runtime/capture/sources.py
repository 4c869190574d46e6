"""Camera sources through OpenCV: files, folders, V4L2, RTSP, HTTP MJPEG, GStreamer/CSI.

`Source` opens one of them and reads BGR frames. Image files (single images and watched folders) go
through the same checked decoder as uploads: a bomb, a truncated or a corrupt file is refused by its
header and reported to the camera (`RefusedFiles` remembers it, so it is logged once).
"""

from __future__ import annotations

import logging
import os
import re
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np

from edge_runtime.config import CameraConfig, ImageLimits
from edge_runtime.core.errors import ImageError
from edge_runtime.core.images import read_image_file

log = logging.getLogger(__name__)

# FFmpeg's own lines ("[rtsp @ 0x...] ...") bypass our logger and the one-line-per-event log; the
# camera's state and last_error already say what failed. OpenCV reads this when the first FFmpeg
# capture opens, so setting it here (before any VideoCapture) is in time. OpenCV's own "[ WARN...]"
# lines are silenced in images.py. A user who sets the variable gets FFmpeg's output back.
os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".heic", ".heif"}


class RefusedFiles:
    """Files a folder camera refused, by (path, size, mtime): logged once, skipped until they change."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._seen: OrderedDict[tuple[str, int, int], str] = OrderedDict()
        self.capacity = capacity

    @staticmethod
    def _key(path: Path) -> tuple[str, int, int] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return str(path), st.st_size, st.st_mtime_ns

    def reason(self, path: Path) -> str | None:
        key = self._key(path)
        return self._seen.get(key) if key else None

    def add(self, path: Path, reason: str) -> None:
        key = self._key(path)
        if key is None:
            return
        self._seen[key] = reason
        while len(self._seen) > self.capacity:  # bounded: a folder of junk must not grow memory
            self._seen.popitem(last=False)


def csi_pipeline(sensor_id: int = 0, width: int = 1920, height: int = 1080, fps: float = 30,
                 flip_method: int = 0) -> str:
    """The standard Jetson CSI camera pipeline (nvarguscamerasrc) ending in BGR for OpenCV."""
    return (
        f"nvarguscamerasrc sensor-id={sensor_id} ! "
        f"video/x-raw(memory:NVMM), width=(int){width}, height=(int){height}, "
        f"framerate=(fraction){round(fps)}/1, format=(string)NV12 ! "
        f"nvvidconv flip-method={flip_method} ! video/x-raw, format=(string)BGRx ! "
        "videoconvert ! video/x-raw, format=(string)BGR ! appsink drop=true max-buffers=1 sync=false"
    )


def source_kind(cfg: CameraConfig) -> str:
    """Resolve `kind: auto` from the source string."""
    if cfg.kind != "auto":
        return cfg.kind
    src = str(cfg.source)
    if re.fullmatch(r"\d+", src) or src.startswith("/dev/video"):
        return "v4l2"
    scheme = src.split("://", 1)[0].lower() if "://" in src else ""
    if scheme in ("rtsp", "rtsps", "rtmp"):
        return "rtsp"
    if scheme in ("http", "https"):
        return "http"
    if "!" in src:
        return "gstreamer"
    path = Path(src.removeprefix("file://"))
    if path.is_dir():
        return "folder"
    if path.suffix.lower() in IMAGE_SUFFIXES:
        return "image"
    if not path.exists() and (not path.suffix or src.endswith("/")):
        return "folder"  # video files have a suffix; a watched folder may not exist yet
    return "video"


class Source:
    """One opened capture; `read()` returns a BGR frame or None when the source failed or ended."""

    def __init__(self, cfg: CameraConfig, limits: ImageLimits | None = None,
                 refused: RefusedFiles | None = None) -> None:
        self.cfg = cfg
        self.kind = source_kind(cfg)
        self.limits = limits or ImageLimits()
        self.refused = refused if refused is not None else RefusedFiles()
        self.cap: cv2.VideoCapture | None = None
        self._images: Iterator[Path] | None = None
        self.path = Path(str(cfg.source).removeprefix("file://"))
        self.new_refusals: list[tuple[Path, str]] = []  # refused during the last read, for the camera
        self.refused_count = 0  # files skipped as refused since this source opened
        self.last_refusal: str | None = None
        self.pace_s = 0.0  # files are paced to a frame rate so they behave like cameras
        self._open()

    def _open(self) -> None:
        cfg, src = self.cfg, str(self.cfg.source)
        timeouts = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, int(cfg.open_timeout_s * 1000),
                    cv2.CAP_PROP_READ_TIMEOUT_MSEC, int(cfg.read_timeout_s * 1000)]
        if self.kind in ("image", "folder"):
            self._images = iter(self._image_files())
            self.pace_s = 1.0 / (cfg.fps or 1.0)
            return
        if self.kind == "v4l2":
            device = int(src) if src.isdigit() else src
            if isinstance(device, str) and not Path(device).exists():
                raise OSError(f"no such video device: {device}")
            self.cap = cv2.VideoCapture(device, cv2.CAP_V4L2)
            if cfg.fourcc:
                self.cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter.fourcc(*cfg.fourcc))
            if cfg.width:
                self.cap.set(cv2.CAP_PROP_FRAME_WIDTH, cfg.width)
            if cfg.height:
                self.cap.set(cv2.CAP_PROP_FRAME_HEIGHT, cfg.height)
            if cfg.fps:
                self.cap.set(cv2.CAP_PROP_FPS, cfg.fps)
            self.cap.set(cv2.CAP_PROP_BUFFERSIZE, 1)  # newest frame, not a stale queue
        elif self.kind in ("rtsp", "http"):
            if self.kind == "rtsp" and cfg.rtsp_transport == "tcp":
                os.environ.setdefault("OPENCV_FFMPEG_CAPTURE_OPTIONS", "rtsp_transport;tcp")
            self.cap = cv2.VideoCapture(src, cv2.CAP_FFMPEG, timeouts)
        elif self.kind in ("gstreamer", "csi"):
            if not cv2.videoio_registry.hasBackend(cv2.CAP_GSTREAMER):
                raise OSError("this OpenCV build has no GStreamer support (PyPI's opencv-python wheels lack it): "
                              "use the L4T image's OpenCV for gstreamer/csi cameras")
            pipeline = src if self.kind == "gstreamer" else csi_pipeline(
                cfg.csi.sensor_id, cfg.width or 1920, cfg.height or 1080, cfg.fps or 30, cfg.csi.flip_method)
            self.cap = cv2.VideoCapture(pipeline, cv2.CAP_GSTREAMER)
        else:  # video file
            if not self.path.is_file():
                raise OSError(f"no such video file: {self.path}")
            self.cap = cv2.VideoCapture(str(self.path), cv2.CAP_FFMPEG, timeouts)
            native = self.cap.get(cv2.CAP_PROP_FPS) if self.cap.isOpened() else 0
            self.pace_s = 1.0 / (cfg.fps or (native if 0 < native < 240 else 10))
        if self.cap is None or not self.cap.isOpened():
            raise OSError(f"OpenCV could not open {self.kind} source {redact(src)}")
        # The stream's frame size, where the backend knows it before the first decode.
        width, height = (int(self.cap.get(p)) for p in (cv2.CAP_PROP_FRAME_WIDTH, cv2.CAP_PROP_FRAME_HEIGHT))
        if width * height > self.limits.max_pixels:
            self.close()
            raise OSError(f"frames of {width}x{height} pixels are more than images.max_pixels "
                          f"({self.limits.max_pixels}); lower the camera's resolution")

    def _image_files(self) -> list[Path]:
        path = self.path
        if self.kind == "image":
            if not path.is_file():
                raise OSError(f"no such image file: {path}")
            return [path]
        if not path.is_dir():
            raise OSError(f"no such folder: {path}" if not path.exists() else f"{path} is not a folder")
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise OSError(f"the folder {path} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        return files

    def read(self) -> np.ndarray | None:
        if self._images is not None:
            return self._next_image(self._images)
        assert self.cap is not None
        ok, frame = self.cap.read()
        if not ok or frame is None or not frame.size:
            return None
        if frame.shape[0] * frame.shape[1] > self.limits.max_pixels:  # a camera that changed mode
            raise ImageError(f"a frame of {frame.shape[1]}x{frame.shape[0]} pixels is more than "
                             f"images.max_pixels ({self.limits.max_pixels})")
        return frame

    def _next_image(self, images: Iterator[Path]) -> np.ndarray | None:
        """The next file that passes the decoder's checks; refused files are skipped and reported."""
        lim = self.limits
        for path in images:
            known = self.refused.reason(path)
            if known is not None:
                self.refused_count += 1
                self.last_refusal = known
                continue
            try:
                return read_image_file(path, lim.max_pixels, lim.min_side, int(lim.max_file_mb * 2**20))
            except Exception as exc:  # noqa: BLE001 - one bad file must not stop the folder (a raise
                # here would reopen the folder at its first file, and never reach the files after it)
                if not path.exists():  # removed since the folder was listed: not the file's fault
                    continue
                reason = str(exc) if isinstance(exc, ImageError) else f"{path}: decoder error: {exc}"
                self.refused.add(path, reason)
                self.refused_count += 1
                self.last_refusal = reason
                self.new_refusals.append((path, reason))
        return None

    @property
    def is_file(self) -> bool:
        return self.kind in ("image", "folder", "video")

    def close(self) -> None:
        if self.cap is not None:
            self.cap.release()
            self.cap = None


def redact(url: str) -> str:
    """Hide credentials in URLs before they reach a log line or the status page."""
    return re.sub(r"//([^/@:]+):([^/@]+)@", r"//\1:***@", url)


def crop(frame: np.ndarray, roi: tuple[int, int, int, int] | None) -> np.ndarray:
    if roi is None:
        return frame
    x, y, w, h = roi
    out = frame[max(0, y):y + h, max(0, x):x + w]
    return out if out.size else frame
