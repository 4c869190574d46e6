"""Fitting a bank from good parts' features: the place weight, the coreset, the header.

Where a patch lies counts (`position_weight`, default 4): on a station whose parts sit in a fixture,
a patch is compared with the good patches at the same place, so a hole that was not drilled is not
matched by plain metal from elsewhere on the plate (PatchCore alone, which ignores position, let an
undrilled hole of every size pass on some synthetic parts; with the place weighed it caught all). The weight
is in units of the good parts' typical patch distance, measured on the fit images themselves: one
patch of displacement costs `position_weight` typical distances. 0 ignores the place (parts that lie
anywhere in the frame).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_runtime.core.result import utc_now
from edge_runtime.inference.anomaly.bank import (
    BankEncoder,
    BankHeader,
    BankLayout,
    BankPart,
    BankThreshold,
    BankVectors,
)
from edge_runtime.inference.anomaly.coreset import greedy_coreset
from edge_runtime.inference.anomaly.features import GateContext, PatchFeatures, with_positions
from edge_runtime.inference.anomaly.search import PatchIndex

DEFAULT_MAX_PATCHES = 10_000
DEFAULT_POSITION_WEIGHT = 4.0
MAX_CANDIDATE_BYTES = 1 << 30  # the patches the coreset chooses from, at full width: bounded memory
_TYPICAL_SAMPLE = 4096


@dataclass
class FitResult:
    """The bank's vectors (with their places) and the numbers of the fit, for the header."""

    vectors: np.ndarray
    typical_distance: float
    position_weight: float  # absolute: distance per patch of displacement
    images: int
    patches_seen: int
    candidates: int
    stats: dict[str, Any] = field(default_factory=dict)


def typical_distance(features: Sequence[PatchFeatures], seed: int = 0) -> float:
    """The median distance of a good patch to its nearest patch in other good images (place ignored):
    the unit the place weight is measured in. Half the images against the other half."""
    if len(features) < 2:
        raise ValueError("fitting needs at least 2 good images")
    rng = np.random.default_rng([seed, 7])
    ref = np.concatenate([f.vectors for f in features[0::2]])
    probe = np.concatenate([f.vectors for f in features[1::2]])
    if probe.shape[0] > _TYPICAL_SAMPLE:
        probe = probe[rng.choice(probe.shape[0], _TYPICAL_SAMPLE, replace=False)]
    index = PatchIndex(ref.shape[1])
    index.add(ref)
    return max(float(np.median(index.nearest(probe))), 1e-6)


def fit_bank(features: Sequence[PatchFeatures], max_patches: int = DEFAULT_MAX_PATCHES,
             position_weight: float = DEFAULT_POSITION_WEIGHT, seed: int = 0,
             max_candidate_bytes: int = MAX_CANDIDATE_BYTES,
             progress: Callable[[int, int], None] | None = None) -> FitResult:
    """A bank of at most `max_patches` patch vectors from the good images' `features` (all of one
    frame size and patch grid). Over `max_candidate_bytes`, each image gives an equal random share of
    its patches before the coreset chooses."""
    if not features:
        raise ValueError("no good image to fit")
    grid, size = features[0].layout.grid(), (features[0].layout.width, features[0].layout.height)
    for f in features:
        if f.layout.grid() != grid or (f.layout.width, f.layout.height) != size:
            raise ValueError("every fit image must have the same frame size and patch grid")
    base = typical_distance(features, seed)
    weight = position_weight * base
    seen = sum(f.vectors.shape[0] for f in features)
    dim = features[0].vectors.shape[1] + 2
    keep = max(1, min(seen, max_candidate_bytes // (dim * 4)))
    per_image = max(1, keep // len(features))
    rng = np.random.default_rng([seed, 3])
    rows = []
    for f in features:
        aug = with_positions(f.vectors, f.layout, weight)
        if aug.shape[0] > per_image and keep < seen:
            aug = aug[np.sort(rng.choice(aug.shape[0], per_image, replace=False))]
        rows.append(aug)
    candidates = np.concatenate(rows)
    chosen = greedy_coreset(candidates, max_patches, seed, progress)
    return FitResult(np.ascontiguousarray(candidates[chosen]), base, weight, len(features), seen,
                     candidates.shape[0])


def bank_header(fit: FitResult, context: GateContext, layout_of: PatchFeatures,
                threshold: BankThreshold | None = None, extra: dict[str, Any] | None = None,
                part: BankPart | None = None) -> BankHeader:
    """The header of a fitted bank (its sha256 is filled in by `write_bank`); `part`: the program's
    region it is the section of (None: whole frames)."""
    lay = layout_of.layout
    enc = context.encoder
    return BankHeader(
        created=utc_now(),
        encoder=BankEncoder(kind=enc.kind, file=enc.file, sha256=enc.sha256, bundle=enc.bundle),
        budget=context.budget, region=context.region,
        layout=BankLayout(width=lay.width, height=lay.height, grid=[(r, c) for r, c in lay.grid()],
                          embed_dim=layout_of.vectors.shape[1], position_weight=fit.position_weight),
        vectors=BankVectors(patches=fit.vectors.shape[0], dim=fit.vectors.shape[1]),
        fit={"images": fit.images, "patches_seen": fit.patches_seen, "candidates": fit.candidates,
             "coreset": fit.vectors.shape[0] < fit.candidates, "typical_distance": fit.typical_distance,
             **(extra or {})},
        threshold=threshold or BankThreshold(), part=part)
