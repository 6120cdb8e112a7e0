"""A child process that dies with the process that started it (Linux PR_SET_PDEATHSIG), so
nothing is left behind. The child sets it itself, first thing: a Python `preexec_fn` would run
Python between fork and exec in a parent that may have other threads (gRPC's, once a deployment
serves), and such a child can deadlock or abort there; without one the child is vfork'd and
execs at once."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
PARENT_ENV = "PDDFLOW_DIE_WITH_PARENT"  # the pid of the process a child dies with


def parent_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) telling a child to die with this process."""
    return {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}


def die_with_parent() -> None:
    """In a child started with `parent_env`: be killed when that parent ends (and end now if it
    already has). Elsewhere (no PARENT_ENV, not Linux): nothing."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or sys.platform != "linux":
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        return  # the parent's own cleanup still stops the child
    if os.getppid() != int(parent):  # the parent died before prctl took hold
        os._exit(1)
