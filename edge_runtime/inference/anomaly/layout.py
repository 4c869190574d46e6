"""Where each image embedding came from: the patch layout of an encoded frame, in frame pixels.

The gate scores every embedding the encoder produced; the heat map needs to know which part of the
frame each one looked at. An ONNX bundle's layout follows from its preprocessing (plain resize,
letterbox, CLIP-style centre crop, Idefics3 tiles + the global image), which `onnx_layout` mirrors
step for step from `inference/vision.py`'s `Preprocessor`. A GGUF + mmproj bundle's images come from
libmtmd: a single image chunk covers the whole frame, its grid read from the M-RoPE positions
(Qwen2.5/3-VL), a square token count (Gemma 3, InternVL, SmolVLM tiles), or the `grids` the caller
passes (libmtmd's `mtmd_image_tokens_get_nx/ny`). A chunk whose place in the frame is not known
(the slices of a multi-chunk image) is still scored; it has no box, so it adds nothing to the heat map.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_runtime.core.bundle.manifest import Preprocess

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in frame pixels (may reach past the frame: padding)


@dataclass(frozen=True)
class PatchBlock:
    """One run of embeddings: `rows x cols` patches in row-major order over `box` (None: place unknown)."""

    rows: int
    cols: int
    box: Box | None

    @property
    def size(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class PatchLayout:
    """The blocks of one encoded frame, in the order of its embeddings, and the frame they map onto."""

    blocks: tuple[PatchBlock, ...]
    width: int
    height: int

    @property
    def patches(self) -> int:
        return sum(b.size for b in self.blocks)

    def grid(self) -> list[list[int]]:
        """The block shapes: what must match between a bank and the frames it scores."""
        return [[b.rows, b.cols] for b in self.blocks]

    def patch_box(self, index: int) -> Box | None:
        """The frame box of embedding `index` (None where its block has no place)."""
        for b in self.blocks:
            if index < b.size:
                if b.box is None:
                    return None
                r, c = divmod(index, b.cols)
                x0, y0, x1, y1 = b.box
                pw, ph = (x1 - x0) / b.cols, (y1 - y0) / b.rows
                return (x0 + c * pw, y0 + r * ph, x0 + (c + 1) * pw, y0 + (r + 1) * ph)
            index -= b.size
        raise IndexError("patch index past the layout")

    def to_dict(self) -> dict[str, Any]:
        return {"width": self.width, "height": self.height,
                "blocks": [{"rows": b.rows, "cols": b.cols, "box": None if b.box is None else list(b.box)}
                           for b in self.blocks]}


def factor_grid(n: int, aspect: float) -> tuple[int, int]:
    """(rows, cols) with rows * cols == n whose rows/cols is nearest `aspect` (height / width)."""
    best = (1, n)
    for rows in range(1, math.isqrt(n) + 1):
        if n % rows:
            continue
        for r, c in ((rows, n // rows), (n // rows, rows)):
            if abs(math.log(r / c / aspect)) < abs(math.log(best[0] / best[1] / aspect)):
                best = (r, c)
    return best


def onnx_layout(spec: Preprocess, width: int, height: int, grid: tuple[int, int], n_embeds: int) -> PatchLayout:
    """The layout of an ONNX encoder's output for a `width x height` frame preprocessed by `spec`.

    `grid` is what `Preprocessor.process` returned ((rows, cols) of tiles, (0, 0) untiled) and
    `n_embeds` the number of embeddings it encoded into."""
    tiles = grid[0] * grid[1] + 1 if grid != (0, 0) else 1
    if n_embeds % tiles:
        raise ValueError(f"{n_embeds} embeddings do not split into {tiles} tiles")
    per_tile = n_embeds // tiles
    rows, cols = factor_grid(per_tile, spec.height / spec.width)
    full: Box = (0.0, 0.0, float(width), float(height))
    if grid != (0, 0):
        # Tiles cut the resized frame row-major; the global image (last) is the whole frame.
        tr, tc = grid
        blocks = [PatchBlock(rows, cols, (width * c / tc, height * r / tr, width * (c + 1) / tc, height * (r + 1) / tr))
                  for r in range(tr) for c in range(tc)]
        return PatchLayout((*blocks, PatchBlock(rows, cols, full)), width, height)
    if spec.tiling is not None or (spec.shortest_edge is None and not spec.keep_aspect):
        return PatchLayout((PatchBlock(rows, cols, full),), width, height)
    if spec.shortest_edge is not None:
        s = spec.shortest_edge  # as Preprocessor._resize_crop: shortest edge to s, centre crop
        nw, nh = (s, int(s * height / width)) if width <= height else (int(s * width / height), s)
        pw, ph = max(nw, spec.width), max(nh, spec.height)  # padded at right/bottom when smaller
        left, top = (pw - spec.width) // 2, (ph - spec.height) // 2
        sx, sy = width / nw, height / nh
        box = (left * sx, top * sy, (left + spec.width) * sx, (top + spec.height) * sy)
        return PatchLayout((PatchBlock(rows, cols, box),), width, height)
    ratio = min(spec.width / width, spec.height / height)  # letterbox, as Preprocessor._fit
    nw, nh = max(1, round(width * ratio)), max(1, round(height * ratio))
    left, top = (spec.width - nw) // 2, (spec.height - nh) // 2
    sx, sy = width / nw, height / nh
    box = (-left * sx, -top * sy, (spec.width - left) * sx, (spec.height - top) * sy)
    return PatchLayout((PatchBlock(rows, cols, box),), width, height)


def media_layout(blocks: Sequence[Any], width: int, height: int,
                 grids: Sequence[tuple[int, int] | None] | None = None) -> PatchLayout:
    """The layout of libmtmd's image chunks (`MediaEmbeds`, in prompt order) for a frame.

    `grids[i]` (rows, cols) is chunk i's grid when the caller knows it (libmtmd's ny/nx); otherwise it
    is read from the chunk's M-RoPE positions, or taken as square when the count is a square."""
    out: list[PatchBlock] = []
    full: Box = (0.0, 0.0, float(width), float(height))
    for i, m in enumerate(blocks):
        n = len(m)
        known = grids[i] if grids is not None and i < len(grids) else None
        shape = known or _mrope_grid(m) or _square(n)
        if shape is None or shape[0] * shape[1] != n:
            out.append(PatchBlock(1, n, None))  # scored, not placed
            continue
        # One chunk is the whole (resized) frame; several are slices whose boxes libmtmd does not report.
        out.append(PatchBlock(shape[0], shape[1], full if len(blocks) == 1 else None))
    return PatchLayout(tuple(out), width, height)


def _mrope_grid(m: Any) -> tuple[int, int] | None:
    """(rows, cols) from M-RoPE positions [4, N] (t, y, x, z) at a first position of 0, when they are a
    row-major grid (Qwen2.5-VL, Qwen3-VL)."""
    pos = getattr(m, "mrope", None)
    if pos is None or pos.ndim != 2 or pos.shape[0] < 3 or pos.shape[1] == 0:
        return None
    y, x = pos[1].astype(np.int64), pos[2].astype(np.int64)
    y, x = y - y.min(), x - x.min()
    rows, cols = int(y.max()) + 1, int(x.max()) + 1
    if rows * cols != pos.shape[1]:
        return None
    order = np.arange(rows * cols)
    if not (np.array_equal(y, order // cols) and np.array_equal(x, order % cols)):
        return None
    return rows, cols


def _square(n: int) -> tuple[int, int] | None:
    s = math.isqrt(n)
    return (s, s) if s * s == n else None
