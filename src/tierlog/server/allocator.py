"""Allocator tuning so memory freed after a burst of readers goes back to the OS.

glibc's malloc serves large blocks (the object store's GET buffers, Deliver pieces)
with mmap only up to a *dynamic* threshold that rises to the size of any mmapped block
freed (up to 32 MiB): after the first burst of 4 MiB GETs they come from the heap
arenas, which keep freed memory, so RSS stays hundreds of MiB above its baseline after
the readers leave. Fixing the threshold (``mallopt(M_MMAP_THRESHOLD)``) turns the
dynamic rule off: blocks at or above it are mmapped and unmapped when freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from tierlog.logs import get_logger

log = get_logger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
DEFAULT_MMAP_THRESHOLD = 1 << 20


def tune_allocator(mmap_threshold: int = DEFAULT_MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (and trim threshold) at ``mmap_threshold`` bytes;
    False where the C library has no ``mallopt`` (musl, macOS) or refuses."""
    if mmap_threshold <= 0:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(M_TRIM_THRESHOLD, 2 * mmap_threshold)
    )
    log.info("allocator_tuned", mmap_threshold=mmap_threshold, ok=ok)
    return ok
