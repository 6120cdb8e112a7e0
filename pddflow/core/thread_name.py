"""The calling thread's name as the OS shows it (/proc/PID/task/TID/comm, 15 bytes, Linux), so a
profile or a per-thread CPU reading can tell what a process's CPU went to (the emulated link's
relays name theirs)."""

from __future__ import annotations

import ctypes
import sys

_PR_SET_NAME = 15
_libc = ctypes.CDLL("libc.so.6", use_errno=True) if sys.platform == "linux" else None


def name_os_thread(name: str) -> None:
    if _libc is not None:
        _libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
