"""Give the C heap's freed pages back to the system (glibc's `malloc_trim`).

glibc keeps memory freed by threads in per-thread arenas (up to 8 per core) instead of returning it, so
a model swap, whose old model's buffers are freed from many native threads, left the daemon 1.3-5.7 MB
bigger each time (docs/reliability.md). `malloc_trim(0)` walks every arena and releases its free pages.
Where the C library has no `malloc_trim` (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim from the process's own symbols, or None where the C library has none."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
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
