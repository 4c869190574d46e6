"""Image decoding, OpenCV preprocessing and the ONNX Runtime vision encoder.

`decode_image` turns untrusted bytes into a BGR frame or raises ImageError with a clear reason;
`Preprocessor` makes the encoder's input tensor; `VisionEncoder` owns (and closes) the ORT session.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from .bundle import Preprocess
from .errors import ImageError, ImageTooLarge

log = logging.getLogger(__name__)

# Our own max_pixels check below replaces Pillow's global bomb warning.
Image.MAX_IMAGE_PIXELS = None

SUPPORTED_FORMATS = {"JPEG", "PNG", "BMP", "TIFF", "WEBP"}
_INTERPOLATION = {
    "nearest": cv2.INTER_NEAREST, "linear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA,
    "cubic": cv2.INTER_CUBIC, "lanczos": cv2.INTER_LANCZOS4,
}


def decode_image(data: bytes, max_pixels: int = 50_000_000, min_side: int = 16) -> np.ndarray:
    """Decode JPEG/PNG/BMP/TIFF/WebP bytes to a BGR uint8 frame.

    The header is read first (Pillow, no pixel decode) so a decompression bomb is refused before
    any memory is spent on it; truncated JPEG/PNG files are refused even though OpenCV would
    return a half-grey picture for them.
    """
    if not data:
        raise ImageError("the image is empty (0 bytes)")
    try:
        with Image.open(io.BytesIO(data)) as header:
            fmt, (width, height) = header.format, header.size
    except Image.DecompressionBombError:
        raise ImageTooLarge("the image declares too many pixels (decompression bomb refused)") from None
    except Exception:  # noqa: BLE001 - Pillow raises many types for garbage input
        raise ImageError("the data is not an image in a supported format "
                         f"({', '.join(sorted(SUPPORTED_FORMATS))})") from None
    if fmt not in SUPPORTED_FORMATS:
        raise ImageError(f"unsupported image format {fmt}; use one of {', '.join(sorted(SUPPORTED_FORMATS))}")
    if width * height > max_pixels:
        raise ImageTooLarge(f"the image declares {width}x{height} pixels, more than the limit of "
                         f"{max_pixels} pixels")
    if min(width, height) < min_side:
        raise ImageError(f"the image is {width}x{height} pixels; each side must be at least {min_side}")
    if fmt == "JPEG" and b"\xff\xd9" not in data[-64:]:
        raise ImageError("the JPEG is truncated (no end-of-image marker)")
    if fmt == "PNG" and b"IEND" not in data[-32:]:
        raise ImageError("the PNG is truncated (no IEND chunk)")
    frame = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if frame is None:
        raise ImageError(f"the {fmt} image is corrupt and could not be decoded")
    return frame


def read_image_file(path: Path | str, max_pixels: int = 50_000_000, min_side: int = 16) -> np.ndarray:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ImageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ImageError(f"{path} is a folder, not an image file") from None
    except OSError as exc:
        raise ImageError(f"{path} cannot be read: {exc.strerror}") from None
    try:
        return decode_image(data, max_pixels, min_side)
    except ImageError as exc:
        raise ImageError(f"{path}: {exc}") from None


class Preprocessor:
    """BGR frame -> normalised float32 NCHW tensor, exactly as the bundle describes."""

    def __init__(self, spec: Preprocess) -> None:
        self.spec = spec
        self.size = (spec.width, spec.height)
        self.interpolation = _INTERPOLATION[spec.resize]
        # Folding mean/std into one scale and offset makes normalisation one fused multiply-add.
        std = np.asarray(spec.std, np.float32)
        self.scale = (1.0 / (255.0 * std)).reshape(1, 1, 3)
        self.offset = (-np.asarray(spec.mean, np.float32) / std).reshape(1, 1, 3)
        self.clahe = (cv2.createCLAHE(spec.clahe.clip_limit, (spec.clahe.tile_grid,) * 2)
                      if spec.clahe else None)

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        if frame.ndim == 2:
            frame = cv2.cvtColor(frame, cv2.COLOR_GRAY2BGR)
        elif frame.shape[2] == 4:
            frame = cv2.cvtColor(frame, cv2.COLOR_BGRA2BGR)
        if self.clahe is not None:
            lab = cv2.cvtColor(frame, cv2.COLOR_BGR2LAB)
            lab[:, :, 0] = self.clahe.apply(lab[:, :, 0])
            frame = cv2.cvtColor(lab, cv2.COLOR_LAB2BGR)
        frame = self._resize(frame)
        rgb = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB).astype(np.float32)
        tensor = rgb * self.scale + self.offset
        return np.ascontiguousarray(tensor.transpose(2, 0, 1)[None])

    def _resize(self, frame: np.ndarray) -> np.ndarray:
        w, h = self.size
        if not self.spec.keep_aspect:
            return cv2.resize(frame, (w, h), interpolation=self.interpolation)
        fh, fw = frame.shape[:2]
        ratio = min(w / fw, h / fh)
        nw, nh = max(1, round(fw * ratio)), max(1, round(fh * ratio))
        resized = cv2.resize(frame, (nw, nh), interpolation=self.interpolation)
        # Pad with the mean colour so padding normalises to zero.
        fill = tuple(round(m * 255) for m in reversed(self.spec.mean))
        top, left = (h - nh) // 2, (w - nw) // 2
        return cv2.copyMakeBorder(resized, top, h - nh - top, left, w - nw - left,
                                  cv2.BORDER_CONSTANT, value=fill)


def choose_providers(wanted: Sequence[str], available: Sequence[str]) -> list[str]:
    """Keep the configured provider order, drop what this ONNX Runtime build lacks, end on CPU."""
    chosen = [p for p in wanted if p in available]
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen


class VisionEncoder:
    """The ONNX Runtime session of the bundle's vision tower + projector."""

    def __init__(self, path: Path, input_name: str, output_name: str,
                 providers: Sequence[str], threads: int) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3  # keep ORT's own warnings out of our one-line-per-event log
        chosen = choose_providers(providers, ort.get_available_providers())
        skipped = [p for p in providers if p not in chosen]
        if skipped:
            log.info("vision: providers %s not available in this onnxruntime build; using %s",
                     ",".join(skipped), ",".join(chosen))
        self.session: ort.InferenceSession | None = ort.InferenceSession(
            str(path), sess_options=opts, providers=chosen)
        self.providers = self.session.get_providers()
        self.input_name, self.output_name = input_name, output_name

    def encode(self, pixel_values: np.ndarray) -> np.ndarray:
        """[B,3,H,W] float32 -> [B,N,D] float32 image embeddings."""
        if self.session is None:
            raise RuntimeError("vision encoder is closed")
        (out,) = self.session.run([self.output_name], {self.input_name: pixel_values})
        return np.asarray(out, dtype=np.float32)

    def close(self) -> None:
        self.session = None
