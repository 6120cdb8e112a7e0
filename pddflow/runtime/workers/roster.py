"""The workers this runtime ships, registered (each class registers itself beside its definition,
registry.py), and the lookup the worker process starts with."""

from __future__ import annotations

import pddflow.runtime.workers.decoder
import pddflow.runtime.workers.main_decode
import pddflow.runtime.workers.prefill
import pddflow.runtime.workers.relay  # noqa: F401 - their classes register themselves
from pddflow.runtime.workers.registry import WORKERS


def worker_class(op_type: str) -> type:
    """The class that runs an operator type; a type without one is refused before anything runs."""
    if op_type not in WORKERS:
        raise ValueError(
            f"operator type {op_type!r} has no worker in this runtime (it runs "
            f"{', '.join(WORKERS.names())})"
        )
    return WORKERS.get(op_type)
