"""OpenCV preprocessing and the ONNX Runtime vision encoder.

`decode_image` (core/images.py) turns untrusted bytes into a BGR frame or raises
ImageError with a clear reason; `Preprocessor` makes the encoder's input tensor; `VisionEncoder`
owns (and closes) the ORT session.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from edge_runtime.core.bundle.manifest import Preprocess

log = logging.getLogger(__name__)
_INTERPOLATION = {
    "nearest": cv2.INTER_NEAREST, "linear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA,
    "cubic": cv2.INTER_CUBIC, "lanczos": cv2.INTER_LANCZOS4,
}
_PIL_RESAMPLE = {
    "pil_bilinear": Image.Resampling.BILINEAR, "pil_bicubic": Image.Resampling.BICUBIC,
    "pil_lanczos": Image.Resampling.LANCZOS,
}


class Preprocessor:
    """BGR frame -> normalised float32 NCHW tensor (one row per tile), exactly as the bundle describes.

    OpenCV interpolations are the fast default; the `pil_*` ones and `shortest_edge`/`tiling` follow
    Hugging Face's image processors step by step (Pillow resizes on uint8, then rescale and normalise)
    so an exported model sees the pixels its reference implementation sees.
    """

    def __init__(self, spec: Preprocess) -> None:
        self.spec = spec
        self.size = (spec.width, spec.height)
        self.pil_resample = _PIL_RESAMPLE.get(spec.resize)
        self.interpolation = _INTERPOLATION.get(spec.resize, cv2.INTER_AREA)
        # Folding mean/std into one scale and offset makes normalisation one fused multiply-add.
        std = np.asarray(spec.std, np.float32)
        self.scale = (1.0 / (255.0 * std)).reshape(1, 1, 3)
        self.offset = (-np.asarray(spec.mean, np.float32) / std).reshape(1, 1, 3)
        self.clahe = (cv2.createCLAHE(spec.clahe.clip_limit, (spec.clahe.tile_grid,) * 2)
                      if spec.clahe else None)

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        return self.process(frame)[0]

    def process(self, frame: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
        """([T,3,H,W] tensor, (rows, cols) of the tile grid; (0, 0) when the frame is not tiled)."""
        if frame.ndim == 2:
            frame = cv2.cvtColor(frame, cv2.COLOR_GRAY2BGR)
        elif frame.shape[2] == 4:
            frame = cv2.cvtColor(frame, cv2.COLOR_BGRA2BGR)
        if self.clahe is not None:
            lab = cv2.cvtColor(frame, cv2.COLOR_BGR2LAB)
            lab[:, :, 0] = self.clahe.apply(lab[:, :, 0])
            frame = cv2.cvtColor(lab, cv2.COLOR_LAB2BGR)
        rgb = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
        grid = (0, 0)
        if self.spec.tiling is not None:
            images, grid = self._tiles(rgb, self.spec.tiling.longest_edge)
        elif self.spec.shortest_edge is not None:
            images = [self._resize_crop(rgb, self.spec.shortest_edge)]
        else:
            images = [self._fit(rgb)]
        tensor = np.stack([img.astype(np.float32) * self.scale + self.offset for img in images])
        return np.ascontiguousarray(tensor.transpose(0, 3, 1, 2)), grid

    def _resize(self, rgb: np.ndarray, width: int, height: int) -> np.ndarray:
        if (rgb.shape[1], rgb.shape[0]) == (width, height):
            return rgb
        if self.pil_resample is not None:
            return np.asarray(Image.fromarray(rgb).resize((width, height), resample=self.pil_resample))
        return cv2.resize(rgb, (width, height), interpolation=self.interpolation)

    def _fit(self, rgb: np.ndarray) -> np.ndarray:
        w, h = self.size
        if not self.spec.keep_aspect:
            return self._resize(rgb, w, h)
        fh, fw = rgb.shape[:2]
        ratio = min(w / fw, h / fh)
        nw, nh = max(1, round(fw * ratio)), max(1, round(fh * ratio))
        resized = self._resize(rgb, nw, nh)
        # Pad with the mean colour so padding normalises to zero.
        fill = tuple(round(m * 255) for m in self.spec.mean)
        top, left = (h - nh) // 2, (w - nw) // 2
        return cv2.copyMakeBorder(resized, top, h - nh - top, left, w - nw - left,
                                  cv2.BORDER_CONSTANT, value=fill)

    def _resize_crop(self, rgb: np.ndarray, shortest: int) -> np.ndarray:
        """CLIP-style: shortest edge to `shortest` (aspect kept), then the centre width x height."""
        fh, fw = rgb.shape[:2]
        if fw <= fh:
            nw, nh = shortest, int(shortest * fh / fw)
        else:
            nw, nh = int(shortest * fw / fh), shortest
        img = self._resize(rgb, nw, nh)
        w, h = self.size
        if nw < w or nh < h:  # smaller than the crop: pad with zeros, as the processors do
            img = cv2.copyMakeBorder(img, 0, max(0, h - nh), 0, max(0, w - nw), cv2.BORDER_CONSTANT, value=0)
            nh, nw = img.shape[:2]
        top, left = (nh - h) // 2, (nw - w) // 2
        return img[top:top + h, left:left + w]

    def _tiles(self, rgb: np.ndarray, longest: int) -> tuple[list[np.ndarray], tuple[int, int]]:
        """Idefics3/SmolVLM: longest edge to `longest`, up to multiples of the tile, row-major tiles
        plus the whole image at tile size (the global image). Mirrors the HF processor's arithmetic."""
        tile = self.spec.width
        h, w = _scale_longest(rgb.shape[0], rgb.shape[1], longest)
        img = self._resize(rgb, w, h)
        if w >= h:
            w2 = math.ceil(w / tile) * tile
            h2 = math.ceil(int(w2 / (w / h)) / tile) * tile
        else:
            h2 = math.ceil(h / tile) * tile
            w2 = math.ceil(int(h2 * (w / h)) / tile) * tile
        img = self._resize(img, w2, h2)
        if h2 <= tile and w2 <= tile:
            return [img], (0, 0)
        rows, cols = (h2 - tile) // tile + 1, (w2 - tile) // tile + 1
        tiles = [img[r * tile:(r + 1) * tile, c * tile:(c + 1) * tile] for r in range(rows) for c in range(cols)]
        tiles.append(self._resize(img, tile, tile))
        return tiles, (rows, cols)


def _scale_longest(height: int, width: int, longest: int) -> tuple[int, int]:
    """(height, width) with the longest edge at `longest`, the other even (HF's rounding), capped at 4096."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    if width >= height and width > 4096:
        width, height = 4096, int(4096 / aspect)
    elif height > width and height > 4096:
        height, width = 4096, int(4096 * aspect)
    return max(height, 1), max(width, 1)


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
        session = self.session  # read once: close() on another thread (a reload) may clear it meanwhile
        if session is None:
            raise RuntimeError("vision encoder is closed")
        (out,) = session.run([self.output_name], {self.input_name: pixel_values})
        return np.asarray(out, dtype=np.float32)

    def close(self) -> None:
        # ORT frees the session with its last reference, so an encode already running keeps it alive until
        # it returns; idempotent
        self.session = None

    def __enter__(self) -> VisionEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
