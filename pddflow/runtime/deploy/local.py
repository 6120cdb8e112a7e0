"""The `local` backend: every instance of the plan a child process of the deployer, the clusters
emulated on this host, every cross-cluster connection through a cuttable relay."""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pddflow.channels.link_relay import Link, LinkRelay
from pddflow.graph.plan import Plan
from pddflow.runtime.deploy.processes import WorkerProcess, stop_all
from pddflow.runtime.deploy.run_dir import WIRING_FILE, private_file
from pddflow.runtime.transports import transports
from pddflow.runtime.wiring import Wiring


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
            argv = [sys.executable, "-m", "pddflow.runtime.workers", str(path), inst.id]
            w = WorkerProcess(inst.id, argv, log)
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
        for w in self.workers:
            if w.name == instance:
                w.signal(signal.SIGKILL)

    def cutter(self) -> Callable[[str, float, int], None]:
        return self.cut_link

    def cut_link(self, link: str, seconds: float, after_bytes: int = 0) -> None:
        if link not in self.relays:
            raise KeyError(f"no emulated link {link!r}; links: {', '.join(self.relays) or 'none'}")
        self.relays[link][0].link.cut(seconds, after_bytes)

    def stop(self) -> None:
        stop_all(self.workers)
        for relays in self.relays.values():
            for r in relays:
                r.close()
