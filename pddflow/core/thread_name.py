"""The calling thread's name as the OS shows it (/proc/PID/task/TID/comm, 15 bytes, Linux), so a
benchmark can tell what a process's CPU went to: the emulated link's relays are not the frontend's
work, though they run in its process (bench/control_plane.py)."""

from __future__ import annotations

import ctypes
import sys

_PR_SET_NAME = 15
_libc = ctypes.CDLL("libc.so.6", use_errno=True) if sys.platform == "linux" else None


def name_os_thread(name: str) -> None:
    if _libc is not None:
        _libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
