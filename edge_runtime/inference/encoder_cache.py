"""The encoder's outputs kept by image content: a repeated API image, a reference or a re-ask is
encoded once.

The key is the sha256 of the decoded pixels (their shape and dtype with them) plus everything else
that changes the encoding: the encoder's identity (its file's sha256, its precision, the
preprocessing or libmtmd's parameters), the crop cut from the frame and the image token budget. Two
keys that differ in any of these never share an entry. The cache is least-recently-used and bounded
by the bytes of the embeddings it holds; an entry larger than a quarter of the budget is not kept
(a one-off giant would evict every image that repeats). Stored arrays are made read-only: every
holder of a hit shares them.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

Box = tuple[int, int, int, int]  # x, y, w, h in the frame's pixels
T = TypeVar("T")


def pixels_digest(frame: np.ndarray) -> str:
    """sha256 of the decoded pixels with their shape and dtype (the same bytes as another shape are
    another image). hashlib releases the GIL on large buffers."""
    data = np.ascontiguousarray(frame)
    h = hashlib.sha256(f"{data.shape}|{data.dtype.str}|".encode())
    h.update(data.reshape(-1).view(np.uint8).data)
    return h.hexdigest()


@dataclass(frozen=True)
class EncodeKey:
    """Everything an encoding depends on."""

    pixels: str  # pixels_digest of the frame the crop is cut from
    encoder: str  # the encoder's identity: file sha256 and the settings that change its output
    crop: Box | None  # the box cut from the frame before encoding; None: the whole frame
    budget: int | tuple[int, int]  # the image token budget the encoder ran under: its ceiling, or (min, max)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    bytes: int = 0
    entries: int = 0
    budget_bytes: int = 0
    too_large: int = 0  # encodings not kept for being over a quarter of the budget


class EncoderCache(Generic[T]):
    """key -> encoding, LRU, at most `budget_bytes` of embeddings. Thread-safe."""

    def __init__(self, budget_bytes: int, cost: Callable[[T], int]) -> None:
        self.budget = budget_bytes
        self._cost = cost
        self._items: OrderedDict[EncodeKey, tuple[T, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._stats = CacheStats(budget_bytes=budget_bytes)

    def get(self, key: EncodeKey) -> T | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self._stats.misses += 1
                return None
            self._items.move_to_end(key)
            self._stats.hits += 1
            return item[0]

    def put(self, key: EncodeKey, value: T) -> None:
        cost = self._cost(value)
        with self._lock:
            if key in self._items:
                return
            if cost > self.budget // 4:
                self._stats.too_large += 1
                return
            self._items[key] = (value, cost)
            self._stats.bytes += cost
            while self._stats.bytes > self.budget:
                _, (_, old) = self._items.popitem(last=False)
                self._stats.bytes -= old
            self._stats.entries = len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._stats.bytes = self._stats.entries = 0

    def stats(self) -> dict[str, int]:
        with self._lock:
            s = self._stats
            return {"hits": s.hits, "misses": s.misses, "bytes": s.bytes, "entries": s.entries,
                    "budget_bytes": s.budget_bytes, "too_large": s.too_large}

    def __len__(self) -> int:
        return len(self._items)


def frozen(array: np.ndarray) -> np.ndarray:
    """The array made read-only (a cached encoding is shared by every hit)."""
    array.flags.writeable = False
    return array
