"""Host allocator tuning for the CPU path.

Each forward step allocates and frees multi-MB tensors; glibc serves those with fresh mmap()s and
returns them on free, so every step page-faults its working set in again (docs/engine.md has the
cost). Raising the mmap and trim thresholds makes glibc recycle that memory, as a GPU caching
allocator does. Process-wide and permanent; a no-op off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@functools.cache
def keep_freed_memory() -> bool:
    """Returns True when the thresholds were raised."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1) == 1 and ok
    return ok
