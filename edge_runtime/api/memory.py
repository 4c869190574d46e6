"""Keep large request buffers out of malloc's heap, so their memory goes back when they are freed.

glibc serves allocations above `M_MMAP_THRESHOLD` (128 KiB) with their own mmap, unmapped on free; but
the threshold is dynamic: after the first such block is freed it rises to that block's size (up to
32 MiB), and from then on every 10 MB request body (its bytes, its str, its parsed JSON) comes from a
thread's heap arena, which keeps the pages. Six distinct 10 MB chat prompts, each refused, left the
daemon 60-120 MB bigger for good. Setting the threshold once (`mallopt`, which also turns the dynamic
adjustment off) keeps them mmapped: the same six prompts then cost +1 MB (docs/reliability.md).
Elsewhere (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value


def fix_mmap_threshold(threshold: int = THRESHOLD_BYTES) -> bool:
    """Pin glibc's mmap threshold for the whole process; True when it took effect."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused")
    return ok
