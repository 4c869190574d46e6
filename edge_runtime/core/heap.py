"""glibc's heap, tuned so freed memory goes back to the system. Elsewhere (musl, macOS) both do nothing.

- `release_freed_memory` (`malloc_trim`): glibc keeps memory freed by threads in per-thread arenas (up to 8
  per core) instead of returning it, so a model swap, whose old model's buffers are freed from many native
  threads, left the daemon 1.3-5.7 MB bigger each time (docs/reliability.md). `malloc_trim(0)` walks every
  arena and releases its free pages.
- `fix_mmap_threshold` (`mallopt`): glibc serves allocations above `M_MMAP_THRESHOLD` (128 KiB) with their
  own mmap, unmapped on free; but the threshold is dynamic: after the first such block is freed it rises to
  that block's size (up to 32 MiB), and from then on every 10 MB request body (its bytes, its str, its
  parsed JSON) comes from a thread's heap arena, which keeps the pages. Six distinct 10 MB chat prompts,
  each refused, left the daemon 60-120 MB bigger for good. Setting the threshold once (which also turns the
  dynamic adjustment off) keeps them mmapped: the same six prompts then cost +1 MB (docs/reliability.md).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library the process runs on, from its own symbols."""
    return ctypes.CDLL(None)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim from the process's own symbols, or None where the C library has none."""
    try:
        fn = _libc().malloc_trim
    except (OSError, AttributeError):  # no such symbol: not glibc
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_freed_memory() -> bool:
    """Return freed heap pages to the system; True when glibc released some."""
    trim = _malloc_trim()
    if trim is None:
        return False
    released = bool(trim(0))
    log.debug("malloc_trim(0): %s", "released memory" if released else "nothing to release")
    return released


def fix_mmap_threshold(threshold: int = THRESHOLD_BYTES) -> bool:
    """Pin glibc's mmap threshold for the whole process; True when it took effect."""
    try:
        mallopt = _libc().mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused")
    return ok
