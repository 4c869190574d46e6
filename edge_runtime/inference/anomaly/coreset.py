"""Greedy coreset subsampling (PatchCore, Roth et al. 2022, section 3.2): keep the patches that cover
the good parts' feature space best, so a bank of a bounded size answers nearly as a bank of all.

Each step adds the patch farthest from everything kept so far (greedy k-center). Distances in the
selection are taken in a random projection to `SELECTION_DIM` dimensions, as PatchCore does: the
selection needs only a faithful ordering of distances, and the projection makes each step cost
`n x SELECTION_DIM` instead of `n x D`. The bank keeps the chosen patches at full width.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

SELECTION_DIM = 128


def greedy_coreset(vectors: np.ndarray, size: int, seed: int = 0,
                   progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Indices of `size` rows of `vectors` [n, D] chosen by greedy k-center (all rows when n <= size).

    Deterministic for a seed: the first pick is a seeded random row, each next the farthest one."""
    n = vectors.shape[0]
    if size >= n:
        return np.arange(n)
    if size < 1:
        raise ValueError("a coreset needs at least one patch")
    rng = np.random.default_rng(seed)
    z = vectors
    if vectors.shape[1] > SELECTION_DIM:
        proj = rng.standard_normal((vectors.shape[1], SELECTION_DIM)).astype(np.float32)
        z = np.ascontiguousarray(vectors @ (proj / np.sqrt(SELECTION_DIM)))
    z = np.ascontiguousarray(z, dtype=np.float32)
    norms = np.einsum("nd,nd->n", z, z)
    chosen = np.empty(size, np.int64)
    chosen[0] = int(rng.integers(n))
    # Squared distance of every row to its nearest chosen row, kept up to date one pick at a time.
    nearest = norms - 2 * (z @ z[chosen[0]]) + norms[chosen[0]]
    step = max(1, size // 20)
    for i in range(1, size):
        pick = int(np.argmax(nearest))
        chosen[i] = pick
        np.minimum(nearest, norms - 2 * (z @ z[pick]) + norms[pick], out=nearest)
        if progress is not None and i % step == 0:
            progress(i, size)
    return chosen
