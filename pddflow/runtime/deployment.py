"""A deployment: compile the graph, start every instance through a backend (processes, not
policy; docs/runtime.md, Backends), serve the API, stop everything cleanly."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pddflow.channels.link_relay import Link, LinkRelay
from pddflow.graph.plan import Plan
from pddflow.runtime.processes import WorkerProcess, stop_all
from pddflow.runtime.wiring import Wiring

Progress = Callable[[str, int, int], None]  # (message, instances ready, instances total)


class DeployError(Exception):
    """The deployment could not start; the message names the instance and its last output."""


class Backend(Protocol):
    name: str

    def start(self, plan: Plan, wiring: Wiring, run_dir: Path) -> None: ...
    def check(self) -> str | None: ...  # None while every instance runs, else what died and why
    def stop(self) -> None: ...


class LocalBackend:
    """Every instance of the plan as a child process of this one."""

    name = "local"

    def __init__(self) -> None:
        self.workers: list[WorkerProcess] = []
        self.relays: dict[str, list[LinkRelay]] = {}  # link name -> relays of its endpoints

    def start(self, plan: Plan, wiring: Wiring, run_dir: Path) -> None:
        # cross-cluster traffic goes through a cuttable relay
        for link, addrs in wiring.links.items():
            whole = Link()  # the link goes down as a whole
            for addr in addrs:
                scheme, _, hostport = addr.rpartition("://")
                host, port = hostport.rsplit(":", 1)
                relay = LinkRelay((host, int(port)), link=whole)
                self.relays.setdefault(link, []).append(relay)
                wiring.via[addr] = f"{scheme}://{relay.address}" if scheme else relay.address
        path = run_dir / "wiring.json"
        wiring.save(path)
        for inst in plan.instances:
            log = run_dir / f"{inst.id.replace('/', '-')}.log"
            w = WorkerProcess(
                inst.id, [sys.executable, "-m", "pddflow.runtime.worker", str(path), inst.id], log
            )
            w.start()
            self.workers.append(w)

    def check(self) -> str | None:
        for w in self.workers:
            if not w.alive():
                return w.exit_summary()
        return None

    def instances(self) -> list[str]:
        return [w.name for w in self.workers]

    def alive(self, instance: str) -> bool:
        return self._worker(instance).alive()

    def exit_summary(self, instance: str) -> str:
        return self._worker(instance).exit_summary()

    def restart(self, instance: str) -> None:
        self._worker(instance).start()

    def _worker(self, instance: str) -> WorkerProcess:
        return next(w for w in self.workers if w.name == instance)

    def pids(self) -> dict[str, int]:
        return {w.name: w.pid for w in self.workers if w.pid}

    def kill(self, instance: str) -> None:
        """For failure drills and tests."""
        import signal

        for w in self.workers:
            if w.name == instance:
                w.signal(signal.SIGKILL)

    def cut_link(self, link: str, seconds: float, after_bytes: int = 0) -> None:
        if link not in self.relays:
            raise KeyError(f"no emulated link {link!r}; links: {', '.join(self.relays) or 'none'}")
        self.relays[link][0].link.cut(seconds, after_bytes)

    def stop(self) -> None:
        stop_all(self.workers)
        for relays in self.relays.values():
            for r in relays:
                r.close()


BACKENDS: dict[str, Callable[[], Backend]] = {"local": LocalBackend}


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


def make_run_dir(keep: str | None) -> Path:
    if keep:
        p = Path(keep)
        p.mkdir(parents=True, exist_ok=True)
        return p
    return Path(tempfile.mkdtemp(prefix="pddflow-run-"))


def remove_run_dir(path: Path, kept: bool) -> None:
    if not kept:
        shutil.rmtree(path, ignore_errors=True)
