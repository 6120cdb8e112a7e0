"""The argv that starts a Python module of this install in a child process."""

from __future__ import annotations

import sys


def python_module(module: str) -> list[str]:
    """`python -P -m module`: -P keeps the current directory off the child's sys.path. Run from
    a checkout's root, `-m` would put the directory first, and its top-level `kernels/` (the
    package `pddflow.kernels`, mapped there) would shadow the `kernels` package transformers
    looks for, failing its import (`cannot import name 'CUDAProperties' from 'kernels'`)."""
    return [sys.executable, "-P", "-m", module]
