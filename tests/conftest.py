"""The whole suite's start and its garbage collector.

- Bytecode: the suite starts hundreds of processes (deployers, workers, API processes) that each
  import pddflow afresh; where bytecode writing is off (PYTHONDONTWRITEBYTECODE, set on this
  project's development machine) each of them compiled every module again, 0.3-0.7 s of CPU a
  process.
  The session compiles the package once, into its `__pycache__` (git ignores it).
- What collection imported (torch, transformers, every pddflow module: about 300,000 objects) is
  frozen out of the garbage collector, whose full passes would otherwise scan it again and again
  (0.13 s a pass here) while the tests make and drop their own objects.
"""

from __future__ import annotations

import compileall
import gc
import sys
from pathlib import Path


def pytest_sessionstart(session) -> None:
    if sys.dont_write_bytecode:
        import pddflow.kernels

        for package in (pddflow, pddflow.kernels):
            compileall.compile_dir(Path(package.__file__).parent, quiet=1)


def pytest_collection_finish(session) -> None:
    gc.freeze()
