"""The gate's view of an encoded frame: unit-length patch vectors, where each patch lies, and what
made them (the encoder file, its preprocessing or image budget, the crop).

Vectors are compared by direction (each embedding scaled to length 1, so the distance of two is
sqrt(2 - 2 cos)): a language model's input embeddings differ in length from patch to patch for
reasons that say nothing about the part, and in one comparison on the synthetic parts unit vectors
caught scratches from 32 px where raw ones needed 48 (docs/decisions.md, issue 42).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_runtime.config import ModelConfig
from edge_runtime.core.batch import Encoded
from edge_runtime.core.bundle.manifest import Bundle, Manifest, Preprocess
from edge_runtime.inference.anomaly.layout import PatchLayout, media_layout, onnx_layout

_UNPLACED_SPACING = 1000.0  # unplaced blocks sit this far apart in position space: they match only themselves


@dataclass(frozen=True)
class EncoderId:
    """The file whose output the bank holds: the ONNX encoder a bundle runs, or its mmproj."""

    kind: str  # onnx | mmproj
    file: str
    sha256: str
    bundle: str = ""  # name@version, for messages only

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "file": self.file, "sha256": self.sha256, "bundle": self.bundle}


@dataclass(frozen=True)
class GateContext:
    """Everything that changes the features of a frame: a bank fits only frames made the same way."""

    encoder: EncoderId
    budget: dict[str, Any]  # the preprocessing (ONNX) or the image token budget (libmtmd)
    region: tuple[int, int, int, int] | None = None  # the crop [x, y, w, h] the frames were cut to
    preprocess: Preprocess | None = field(default=None, compare=False)  # for the ONNX patch layout
    # An inspection program's region: (name, [x, y, w, h] in the cropped frame); None: the whole frame.
    part: tuple[str, tuple[int, int, int, int]] | None = None


def gate_context(bundle: Bundle, settings: ModelConfig, region: Sequence[int] | None = None,
                 budget: dict[str, Any] | None = None) -> GateContext:
    """The context of frames the inspector of `bundle` under `settings` encodes, cut to `region`.

    `budget` adds to the image budget what a camera sets beyond the bundle (an inspection program's
    image token budget). `for_part` makes the context of one of a program's regions from it."""
    m = bundle.manifest
    roi = None if region is None else (int(region[0]), int(region[1]), int(region[2]), int(region[3]))
    if isinstance(m, Manifest):
        vision = m.files.vision
        if settings.vision_precision == "fp16" and m.files.vision_fp16 is not None:
            vision = m.files.vision_fp16  # another file, other numbers: a bank of the fp32 encoder does not fit
        enc = EncoderId("onnx", vision.path, vision.sha256, bundle.name)
        spent = {"preprocess": m.preprocess.model_dump(mode="json"), **(budget or {})}
        return GateContext(enc, spent, roi, m.preprocess)
    enc = EncoderId("mmproj", m.files.mmproj.path, m.files.mmproj.sha256, bundle.name)
    return GateContext(enc, {"image_max_tokens": m.mtmd.image_max_tokens, **(budget or {})}, roi)


def for_part(context: GateContext, name: str, box: Sequence[int]) -> GateContext:
    """The context of region `name` (`box` [x, y, w, h] in the camera's cropped frame) of a program."""
    return dataclasses.replace(context, part=(name, (int(box[0]), int(box[1]), int(box[2]), int(box[3]))))


@dataclass(frozen=True)
class PatchFeatures:
    """One frame's patch vectors [N, D] (unit length, float32) and their layout."""

    vectors: np.ndarray
    layout: PatchLayout


def patch_features(enc: Encoded, context: GateContext,
                   grids: Sequence[tuple[int, int] | None] | None = None) -> PatchFeatures:
    """The gate's features of a frame the inspector encoded (`Inspector.encode`'s `Encoded`).

    `grids` gives libmtmd chunks' (rows, cols) where the caller knows them (see layout.py)."""
    embeds = np.asarray(enc.embeds, dtype=np.float32)
    if embeds.ndim != 2 or embeds.shape[0] == 0:
        raise ValueError(f"expected image embeddings [N, D], got shape {embeds.shape}")
    parts = getattr(enc, "parts", None)
    if parts is not None:  # libmtmd (MediaEncoded): its image chunks in prompt order
        from edge_runtime.inference.llm.mtmd import MediaEmbeds  # loaded with the inspector that made `enc`

        layout = media_layout([p for p in parts if isinstance(p, MediaEmbeds)], enc.width, enc.height, grids)
    else:
        if context.preprocess is None:
            raise ValueError("an ONNX encoder's frame needs the bundle's preprocessing in its GateContext")
        layout = onnx_layout(context.preprocess, enc.width, enc.height, enc.grid, embeds.shape[0])
    if layout.patches != embeds.shape[0]:
        raise ValueError(f"the layout has {layout.patches} patches for {embeds.shape[0]} embeddings")
    return PatchFeatures(unit_rows(embeds), layout)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (a zero row stays zero)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, 1e-12), dtype=np.float32)


def patch_positions(layout: PatchLayout) -> np.ndarray:
    """[N, 2] (x, y) of each patch's centre in units of the finest patch pitch of the layout; the
    patches of a block with no place in the frame sit apart, matching only their own block."""
    placed = [b for b in layout.blocks if b.box is not None]
    pitch_x = min(((b.box[2] - b.box[0]) / b.cols for b in placed if b.box), default=1.0)
    pitch_y = min(((b.box[3] - b.box[1]) / b.rows for b in placed if b.box), default=1.0)
    out = []
    for i, b in enumerate(layout.blocks):
        r, c = np.divmod(np.arange(b.size, dtype=np.float32), b.cols)
        if b.box is None:
            out.append(np.stack([c + _UNPLACED_SPACING * (i + 1), r], 1))
            continue
        x0, y0, x1, y1 = b.box
        x = (x0 + (c + 0.5) * (x1 - x0) / b.cols) / max(pitch_x, 1e-9)
        y = (y0 + (r + 0.5) * (y1 - y0) / b.rows) / max(pitch_y, 1e-9)
        out.append(np.stack([x, y], 1))
    return np.concatenate(out).astype(np.float32)


def with_positions(vectors: np.ndarray, layout: PatchLayout, weight: float) -> np.ndarray:
    """[N, D + 2]: the vectors with their place appended, scaled so that one patch of displacement
    costs `weight` in distance (0: where a patch lies does not count)."""
    return np.ascontiguousarray(np.concatenate([vectors, weight * patch_positions(layout)], 1), dtype=np.float32)
