"""Process-wide glibc tuning: freed multi-MB buffers are recycled, not faulted in again."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@functools.cache
def keep_freed_memory() -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1) == 1 and ok
    return ok
