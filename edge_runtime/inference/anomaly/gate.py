"""The anomaly gate: a loaded bank that scores frames the inspector encoded.

The score of a frame is the largest distance of any of its patches to its nearest neighbour in the
bank (PatchCore's image score): one patch unlike every good patch is enough to send the part to the
language model. The per-patch distances are kept for the heat map.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_runtime.core.batch import Encoded
from edge_runtime.inference.anomaly.bank import BankError, BankHeader, LoadedBank, read_bank
from edge_runtime.inference.anomaly.features import (
    GateContext,
    PatchFeatures,
    patch_features,
    with_positions,
)
from edge_runtime.inference.anomaly.layout import Box, PatchLayout


class FrameMismatch(BankError):
    """A frame the bank cannot judge: another size or patch grid than the frames it was fitted on."""


@dataclass(frozen=True)
class GateScore:
    """One frame's verdict material: the score, each patch's distance and where each patch lies."""

    score: float
    distances: np.ndarray  # [N] float32, in the order of the encoder's embeddings
    layout: PatchLayout
    search_ms: float = 0.0

    @property
    def worst_patch(self) -> int:
        return int(np.argmax(self.distances))

    def worst_box(self) -> Box | None:
        """The frame box of the patch that decided the score (None if its block has no place)."""
        return self.layout.patch_box(self.worst_patch)


class AnomalyGate:
    """A bank loaded for one encoder, budget and crop; `score` is safe from several threads."""

    def __init__(self, bank: LoadedBank, context: GateContext, search_threads: int = 1) -> None:
        self.header: BankHeader = bank.header
        self.search_threads = search_threads  # gate.search_threads (inference/anomaly/search.py)
        self.path: Path = bank.path
        self.context = context
        self._index = bank.index
        lay = bank.header.layout
        self._grid = [list(g) for g in lay.grid]
        self._weight = lay.position_weight

    @classmethod
    def load(cls, path: Path | str, context: GateContext, max_bytes: int, search_threads: int = 1) -> AnomalyGate:
        """Read and check a bank (BankError, one line, when it does not fit `context` or the bound)."""
        return cls(read_bank(Path(path), max_bytes, context), context, search_threads)

    @property
    def threshold(self) -> float | None:
        """The threshold chosen at fit time (None when none was chosen); a config value overrides it."""
        return self.header.threshold.value

    @property
    def patches(self) -> int:
        return self._index.size

    @property
    def position_weight(self) -> float:
        return self._weight

    def score(self, enc: Encoded, grids: Sequence[tuple[int, int] | None] | None = None) -> GateScore:
        """Score a frame the inspector encoded; FrameMismatch when its size or grid is not the bank's."""
        return self.score_features(patch_features(enc, self.context, grids))

    def score_features(self, feats: PatchFeatures) -> GateScore:
        lay = self.header.layout
        if (feats.layout.width, feats.layout.height) != (lay.width, lay.height):
            raise FrameMismatch(f"gate bank {self.path}: the frame is {feats.layout.width}x{feats.layout.height}; "
                                f"the bank was fitted on {lay.width}x{lay.height} frames")
        if feats.layout.grid() != self._grid or feats.vectors.shape[1] != lay.embed_dim:
            raise FrameMismatch(f"gate bank {self.path}: the frame was encoded into patch grid "
                                f"{feats.layout.grid()} x {feats.vectors.shape[1]}; the bank holds {self._grid} x "
                                f"{lay.embed_dim}")
        t0 = time.perf_counter()
        distances = self._index.nearest(with_positions(feats.vectors, feats.layout, self._weight), self.search_threads)
        ms = (time.perf_counter() - t0) * 1000
        return GateScore(float(distances.max()), distances.astype(np.float32), feats.layout, ms)
