"""What a deployment asks of a backend (docs/runtime.md, Backends): start every instance of a plan
somewhere, say where each runs, watch it, restart it, stop it. Processes, not policy: the backends
are `local.py` (processes on this host) and `ray_backend.py` (actors on a Ray cluster)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pddflow.graph.plan import Plan
from pddflow.runtime.wiring import Wiring

Progress = Callable[[str, int, int], None]  # (message, instances ready, instances total)


class DeployError(Exception):
    """The deployment could not start; the message names the instance and its last output."""


class Backend(Protocol):
    name: str

    def start(self, plan: Plan, wiring: Wiring, run_dir: Path) -> None:
        """Place and start every instance; may rewrite the wiring's addresses (where each one
        listens) before any worker or the frontend reads them."""
        ...

    def check(self) -> str | None: ...  # None while every instance runs, else what died and why
    def describe(self) -> dict[str, Any]: ...  # /health: backend, workers' placement, channels
    def stop(self) -> None: ...

    def cutter(self) -> Callable[[str, float, int], None] | None:
        """How to cut an emulated link (link, seconds, after_bytes) for the admin drill, or None
        when the backend cannot (its cross-cluster connections do not pass through it)."""
        ...

    def impairer(self) -> Callable[[str, float, float, str | None], None] | None:
        """How to partition an emulated link or make it lossy (link, seconds, loss,
        from_cluster) for the admin drill, or None (as `cutter`)."""
        ...

    # what the supervisor watches and restarts by (supervisor.Restartable)
    def instances(self) -> list[str]: ...
    def alive(self, instance: str) -> bool: ...
    def exit_summary(self, instance: str) -> str: ...
    def restart(self, instance: str) -> None: ...


def wait_ready(
    is_ready: Callable[[], tuple[int, int]],
    backend: Backend,
    timeout_s: float,
    progress: Progress | None = None,
) -> None:
    """Until every instance reports ready, a worker dies (DeployError with its output) or the
    deadline passes (DeployError naming the instances still starting)."""
    deadline = time.monotonic() + timeout_s
    last = (-1, -1)
    while True:
        ready, total = is_ready()
        if (ready, total) != last and progress is not None:
            progress("starting workers", ready, total)
            last = (ready, total)
        if ready == total:
            return
        dead = backend.check()
        if dead is not None:
            raise DeployError(dead)
        if time.monotonic() > deadline:
            raise DeployError(
                f"only {ready} of {total} instances became ready within {timeout_s:g} s; "
                "see the worker logs in the run directory"
            )
        time.sleep(0.1)
