"""Host allocator tuning for processes that churn through multi-MB buffers.

glibc serves allocations that large with fresh mmap()s and returns them to the kernel on free, so
a loop that allocates and frees them (the engine's CPU forward step, gRPC's receive buffers in a
wan_flight receiver) page-faults its working set in again every time. Raising the mmap and trim
thresholds makes glibc recycle that memory inside the heap, the same effect as the caching
allocator on a GPU. Process-wide and permanent; a no-op off glibc. No torch: both the engine and
the channels use it. Figures: docs/engine.md (Host memory) and docs/channels.md.
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
