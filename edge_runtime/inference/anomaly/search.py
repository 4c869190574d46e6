"""Nearest-neighbour search over the bank (faiss), bounded in time and memory by the bank's size.

A bank of up to `EXACT_LIMIT` multiply-adds per query (patches x width) is searched exactly by
faiss's `IndexFlatL2`. A larger one is searched in two steps: faiss finds each query's `CANDIDATES`
nearest bank vectors in a random `PROJECTED_DIM`-wide projection (`IndexFlatL2` again, a fraction
of the work), and the exact distance to each candidate is computed in full width; the smallest is
the answer. It is the true distance to a real bank vector, so when the projection misses the nearest
one the score comes out too high, never too low: an approximate search sends a part to the language
model that an exact one would have gated, never the reverse.

faiss computes on its own OpenMP runtime; the search runs on one thread, so it keeps no thread team
beside llama.cpp's on the thread that calls it (inference/openmp.py says why that matters).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

EXACT_LIMIT = 16 * 1024 * 1024  # patches x width searched exactly: 16k patches of 1024, 128k of 130
PROJECTED_DIM = 128
CANDIDATES = 8
_faiss_lock = threading.Lock()
_faiss_ready = False


def _faiss() -> Any:
    """faiss, imported on first use and set to one OpenMP thread."""
    global _faiss_ready
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # which SIMD build it tried, at INFO
    import faiss

    with _faiss_lock:
        if not _faiss_ready:
            faiss.omp_set_num_threads(1)
            _faiss_ready = True
    return faiss


def index_kind(patches: int, dim: int) -> str:
    """`exact` or `projected` (candidates in a narrow projection, then exact distances)."""
    return "exact" if patches * dim <= EXACT_LIMIT or dim <= PROJECTED_DIM else "projected"


def index_bytes(patches: int, dim: int) -> int:
    """What the search holds in memory for a bank of this size."""
    vectors = patches * dim * 4
    return vectors if index_kind(patches, dim) == "exact" else vectors + patches * PROJECTED_DIM * 4


def projection(dim: int, seed: int = 0) -> np.ndarray:
    """A fixed random orthonormal map [dim, PROJECTED_DIM] (the same for the same dim and seed)."""
    rng = np.random.default_rng([seed, dim])
    q, _ = np.linalg.qr(rng.standard_normal((dim, PROJECTED_DIM)))
    return np.ascontiguousarray(q, dtype=np.float32)


class PatchIndex:
    """The bank's vectors in a faiss index: `add` them in chunks, then ask `nearest` distances.

    Searches may run from several threads at once (faiss's flat search only reads)."""

    def __init__(self, patches: int, dim: int, exact: bool = False) -> None:
        faiss = _faiss()
        self.dim = dim
        self.kind = "exact" if exact else index_kind(patches, dim)  # exact=True: for comparisons
        self._full: np.ndarray | None = None
        self._filled = 0
        if self.kind == "exact":
            self._index = faiss.IndexFlatL2(dim)
        else:
            self._proj = projection(dim)
            self._index = faiss.IndexFlatL2(PROJECTED_DIM)
            self._full = np.empty((patches, dim), np.float32)

    @property
    def size(self) -> int:
        return int(self._index.ntotal)

    def add(self, vectors: np.ndarray) -> None:
        chunk = np.ascontiguousarray(vectors, dtype=np.float32)
        if self._full is None:
            self._index.add(chunk)
            return
        n = chunk.shape[0]
        if self._filled + n > self._full.shape[0]:
            raise ValueError("more vectors than the index was made for")
        self._full[self._filled:self._filled + n] = chunk
        self._filled += n
        self._index.add(np.ascontiguousarray(chunk @ self._proj))

    def nearest(self, queries: np.ndarray) -> np.ndarray:
        """The Euclidean distance of each query row to its nearest bank vector ([M] float32)."""
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if self._full is None:
            squared, _ = self._index.search(q, 1)
            return np.sqrt(np.maximum(squared[:, 0], 0.0))
        _, ids = self._index.search(np.ascontiguousarray(q @ self._proj), CANDIDATES)
        ids = np.where(ids < 0, 0, ids)  # fewer vectors than candidates: faiss pads with -1
        diff = self._full[ids] - q[:, None, :]
        return np.sqrt(np.einsum("qkd,qkd->qk", diff, diff).min(axis=1))
