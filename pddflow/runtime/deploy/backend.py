"""A deployment: compile the graph, start every instance through a backend (processes, not
policy; docs/runtime.md, Backends), serve the API, stop everything cleanly."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pddflow.channels.link_relay import Link, LinkRelay
from pddflow.graph.plan import Plan
from pddflow.runtime.deploy.processes import WorkerProcess, stop_all
from pddflow.runtime.deploy.ray_placement import transports
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

    # and the supervisor's (supervisor.Restartable): instances, alive, exit_summary, restart


def with_placement(detail: dict[str, Any], backend: Any) -> dict[str, Any]:
    """/health's body with the backend's word on each instance (node, address) and channel."""
    if backend is None or not hasattr(backend, "describe"):
        return detail
    d = backend.describe()
    placed = d.get("workers", {})
    workers = {i: {**w, **placed.get(i, {})} for i, w in detail.get("workers", {}).items()}
    return {**detail, "backend": d["backend"], "workers": workers, "channels": d["channels"]}


class LocalBackend:
    """Every instance of the plan as a child process of this one."""

    name = "local"

    def __init__(self) -> None:
        self.workers: list[WorkerProcess] = []
        self.relays: dict[str, list[LinkRelay]] = {}  # link name -> relays of its endpoints
        self.wiring: Wiring | None = None

    def start(self, plan: Plan, wiring: Wiring, run_dir: Path) -> None:
        self.wiring = wiring
        # one host: rdma_tensor is shared memory unless an edge asked for a network transport
        wiring.transports = transports(plan, {}, wiring.rdma)
        # cross-cluster traffic goes through a cuttable relay
        for link, addrs in wiring.links.items():
            whole = Link()  # the link goes down as a whole
            for addr in addrs:
                scheme, _, hostport = addr.rpartition("://")
                host, port = hostport.rsplit(":", 1)
                relay = LinkRelay((host, int(port)), link=whole)
                self.relays.setdefault(link, []).append(relay)
                wiring.via[addr] = f"{scheme}://{relay.address}" if scheme else relay.address
        path = run_dir / WIRING_FILE
        private_file(path)  # it holds the deployment's bearer token
        wiring.save(path)
        for inst in plan.instances:
            log = run_dir / f"{inst.id.replace('/', '-')}.log"
            w = WorkerProcess(
                inst.id, [sys.executable, "-m", "pddflow.runtime.workers", str(path), inst.id], log
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

    def describe(self) -> dict[str, Any]:
        import socket

        w = self.wiring
        host = socket.gethostname()
        return {
            "backend": self.name,
            "workers": {
                x.name: {"node": host, "address": w.workers[x.name].rpc if w else "", "pid": x.pid}
                for x in self.workers
            },
            "channels": dict(w.transports) if w else {},
        }

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


def _ray_backend(**kw: Any) -> Backend:
    from pddflow.runtime.deploy.ray_backend import RayBackend

    return RayBackend(**kw)


# name -> factory; the ray backend takes address, namespace, bind_all, accelerators
BACKENDS: dict[str, Callable[..., Backend]] = {"local": LocalBackend, "ray": _ray_backend}


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


RUN_DIR_PREFIX = "pddflow-run-"  # default run directories: the temp dir's pddflow-run-*
OWNER_FILE = "deployer"  # in a default run directory: "PID START_TICKS" of the deployer owning it
WIRING_FILE = "wiring.json"


def private_file(path: Path) -> None:
    """An empty file at path only its owner can read and write (0600), before anything secret is
    written into it; whatever was there is replaced."""
    path.unlink(missing_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot; Linux), so a reused PID is told apart."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _owner_alive(run_dir: Path) -> bool | None:
    """Whether the deployer that made run_dir still runs; None when it has no readable marker
    (not ours to judge: another tool's, or one being created right now)."""
    try:
        pid_s, start_s = (run_dir / OWNER_FILE).read_text().split()
        pid, start = int(pid_s), int(start_s)
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: the PID was reused, unless the start time says otherwise
    now = _start_ticks(pid)
    return now is None or start == 0 or now == start  # 0: its start time was unknown


def clean_stale_run_dirs(parent: Path) -> list[Path]:
    """Remove the default run directories under parent whose deployer has gone (killed with
    SIGKILL, or the machine lost power); returns them."""
    removed = []
    for d in sorted(parent.glob(f"{RUN_DIR_PREFIX}*")):
        try:
            st = d.lstat()
        except OSError:
            continue
        if not d.is_dir() or d.is_symlink() or st.st_uid != os.getuid():
            continue
        if _owner_alive(d) is False:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def make_run_dir(keep: str | None, parent: Path | None = None) -> Path:
    """keep (--run-dir), made 0700 if it is new; else a fresh 0700 directory under parent (the
    temp dir), marked with this process as its owner, after removing stale ones."""
    if keep:
        p = Path(keep)
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
        return p
    parent = Path(parent or tempfile.gettempdir())
    clean_stale_run_dirs(parent)
    p = Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=parent))  # 0700
    me = os.getpid()
    tmp = p / f".{OWNER_FILE}.tmp"
    tmp.write_text(f"{me} {_start_ticks(me) or 0}\n")
    tmp.rename(p / OWNER_FILE)  # whole or absent: a half-written marker is never judged
    return p


def remove_run_dir(path: Path, kept: bool) -> None:
    """The whole directory, or for a kept one (--run-dir) only its secrets: the wiring file (the
    bearer token) and the TLS keys (the ray backend's CA key too)."""
    if not kept:
        shutil.rmtree(path, ignore_errors=True)
        return
    for secret in (path / WIRING_FILE, path / "tls" / "key.pem", path / "tls" / "ca-key.pem"):
        secret.unlink(missing_ok=True)
