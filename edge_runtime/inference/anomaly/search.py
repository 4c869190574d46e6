"""Nearest-neighbour search over the bank: faiss's exact `IndexFlatL2`, on one thread unless told.

Exact, because an approximate index did not pay here: on CPU-2 at 100,000 patches of 898 values an
HNSW graph took 393 s to build and an IVF index searched in 0.6 s against the flat index's 0.8 s,
and a search of 8 candidates in a 128-wide projection (then exact distances) took 1.5 s against the
exact 0.9 s (docs/decisions.md). The time of a search is patches x bank x width; what bounds it is
the bank's size, bounded twice: by the coreset at fit time (`--max-patches`) and by the memory bound
at load (`gate.max_bank_mb`, which refuses a larger bank). faiss compares the queries with the bank
in blocks of 1,024 bank rows, so a search holds a block of distances, never the whole matrix.

faiss computes on its own OpenMP runtime; by default the search runs on one thread, so it keeps no
thread team beside llama.cpp's on the thread that calls it (inference/openmp.py says why that matters).
Where the language model runs on a GPU the CPU is free and the encoder takes milliseconds: there one
thread made the search the frame's largest cost (H200, 3b-shape pair: 388 ms at 10,000 patches against
a 16 ms encode, docs/benchmarks.md), so `gate.search_threads` lets a device give it more.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

_faiss_lock = threading.Lock()
_faiss_ready = False
_threads_set = threading.local()  # OpenMP's thread count is per calling thread: set on each that searches


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


def index_bytes(patches: int, dim: int) -> int:
    """What the search holds in memory for a bank of this size (the vectors, in faiss's index)."""
    return patches * dim * 4


class PatchIndex:
    """The bank's vectors in a faiss index: `add` them in chunks, then ask `nearest` distances.

    Searches may run from several threads at once (faiss's flat search only reads)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._index = _faiss().IndexFlatL2(dim)

    @property
    def size(self) -> int:
        return int(self._index.ntotal)

    def add(self, vectors: np.ndarray) -> None:
        self._index.add(np.ascontiguousarray(vectors, dtype=np.float32))

    def nearest(self, queries: np.ndarray, threads: int = 1) -> np.ndarray:
        """The Euclidean distance of each query row to its nearest bank vector ([M] float32), searched
        on `threads` OpenMP threads."""
        if getattr(_threads_set, "n", None) != threads:
            # The daemon searches on the worker's gate thread, not the one that imported faiss: left at OpenMP's
            # default there, a 49 x 1,470 search took 23.6 ms instead of 0.9 ms on CPU-2 under load.
            _faiss().omp_set_num_threads(threads)
            _threads_set.n = threads
        squared, _ = self._index.search(np.ascontiguousarray(queries, dtype=np.float32), 1)
        return np.sqrt(np.maximum(squared[:, 0], 0.0))
