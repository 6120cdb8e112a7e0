"""The `local` backend: every instance of the plan a child process of the deployer, the clusters
emulated on this host, every cross-cluster connection through a cuttable relay (all of them in
one link process: deploy/link_process.py)."""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pddflow.core.child_python import python_module
from pddflow.graph.plan import Plan
from pddflow.operators.engine_config import cuda_devices, rank_device
from pddflow.runtime.deploy.link_process import LinkProcess, RelaySpec
from pddflow.runtime.deploy.processes import WorkerProcess, stop_all
from pddflow.runtime.deploy.run_dir import WIRING_FILE, private_file
from pddflow.runtime.transports import transports
from pddflow.runtime.wiring import Wiring


class LocalBackend:
    """Every rank process of every instance of the plan a child process of this one."""

    name = "local"

    def __init__(self) -> None:
        # instance -> its rank processes, the leader (rank 0) first
        self.ranks: dict[str, list[WorkerProcess]] = {}
        self.link_process: LinkProcess | None = None  # every emulated link's relays
        # each relay, and where its address goes: (spec, table, key, scheme prefix)
        self._relays: list[tuple[RelaySpec, dict[str, str], str, str]] = []
        self.wiring: Wiring | None = None
        self.gpus = 0  # the CUDA devices the ranks see (a real engine's)
        self.plan: Plan | None = None
        self.run_dir = self.wiring_file = Path()

    def start(self, plan: Plan, wiring: Wiring, run_dir: Path) -> None:
        if wiring.engine == "real":  # where the ranks compute
            self.gpus = cuda_devices()
        self.wiring = wiring
        # one host: rdma_tensor is shared memory unless an edge asked for a network transport
        wiring.transports = transports(plan, {}, wiring.rdma)
        # cross-cluster traffic goes through a cuttable relay: the data channels' and the
        # control plane's between the frontend's cluster and each other one
        for link, addrs in wiring.links.items():
            for addr in addrs:
                scheme, _, hostport = addr.rpartition("://")
                client, server = _sides(plan, wiring, link, addr)
                spec = RelaySpec(link, hostport, client, server)
                self._relays.append((spec, wiring.via, addr, f"{scheme}://" if scheme else ""))
        self._control_relays(plan, wiring)
        if self._relays:
            log = run_dir / "links.log"
            self.link_process = LinkProcess([r[0] for r in self._relays], log)
            for (_, table, key, prefix), address in zip(
                self._relays, self.link_process.addresses, strict=True
            ):
                table[key] = prefix + address
        path = self.wiring_file = run_dir / WIRING_FILE
        private_file(path)  # it holds the deployment's bearer token
        wiring.save(path)
        self.plan, self.run_dir = plan, run_dir
        for inst in plan.initial_instances():
            self.start_instance(inst)

    def _control_relays(self, plan: Plan, wiring: Wiring) -> None:
        """The frontend runs in its cluster: its calls to an instance elsewhere, and that
        instance's reports back, cross the link between them with its RTT (no jitter: that
        models bulk KV queueing, as for token IDs; docs/channels.md)."""
        front = plan.frontend_cluster
        for inst in plan.instances:
            link = plan.link_between(front, inst.cluster)
            if link is None:
                continue
            delay = plan.links[link].rtt_ms / 2e3
            relays = []  # (upstream, the senders' cluster, the receiver's, table, key)
            cluster = inst.cluster
            if cluster not in wiring.report_via:
                wiring.report_via[cluster] = ""  # taken: one reports relay per cluster
                relays.append((wiring.frontend, cluster, front, wiring.report_via, cluster))
            via = wiring.api_via.setdefault(inst.cluster, {})
            for name, address in wiring.api_servers.items():
                if name not in via:
                    via[name] = ""
                    relays.append((address, inst.cluster, front, via, name))
            rpc = wiring.workers[inst.id].rpc
            relays.append((rpc, front, inst.cluster, wiring.control_via, rpc))
            for upstream, client, server, table, key in relays:
                spec = RelaySpec(link, upstream, client, server, delay)
                self._relays.append((spec, table, key, ""))

    def start_instance(self, instance: str) -> None:
        """Start every rank process of `instance` (at start, or when live scaling adds it)."""
        procs = self.ranks[instance] = []
        for rank, name in enumerate(self.plan.rank_processes(instance)):
            argv = [*python_module("pddflow.runtime.workers"), str(self.wiring_file)]
            argv += [instance] + ([str(rank)] if rank else [])
            w = WorkerProcess(name, argv, self.run_dir / log_name(name))
            w.start()
            procs.append(w)

    def stop_instance(self, instance: str) -> None:
        """Stop `instance`'s processes and stop watching it (live scaling took it away)."""
        procs = self.ranks.pop(instance, [])
        stop_all([p for p in procs if p.alive()])

    def check(self) -> str | None:
        for inst in self.ranks:
            if not self.alive(inst):
                return self.exit_summary(inst)
        return None

    def instances(self) -> list[str]:
        return list(self.ranks)

    def describe(self) -> dict[str, Any]:
        w = self.wiring
        host = socket.gethostname()
        workers = {}
        for inst, procs in self.ranks.items():
            workers[inst] = {"node": host, "address": w.workers[inst].rpc if w else ""}
            workers[inst]["pid"] = procs[0].pid
            workers[inst]["ranks"] = [
                {"rank": r, "pid": p.pid, "device": rank_device(r, gpus=self.gpus), "node": host}
                for r, p in enumerate(procs)
            ]
        lp = self.link_process
        return {
            "backend": self.name,
            "workers": workers,
            "channels": dict(w.transports) if w else {},
            **({"link_process": {"pid": lp.pid, "links": lp.links}} if lp else {}),
        }

    def alive(self, instance: str) -> bool:
        """Every rank runs: one rank lost is the instance lost (one no longer run: nothing to
        restart)."""
        return all(p.alive() for p in self.ranks.get(instance, []))

    def exit_summary(self, instance: str) -> str:
        procs = self.ranks[instance]
        return next((p for p in procs if not p.alive()), procs[0]).exit_summary()

    def restart(self, instance: str) -> None:
        """All its ranks together: the survivors of a lost rank are stopped first (a tensor
        parallel group cannot take a new member)."""
        procs = self.ranks.get(instance)
        if procs is None:  # live scaling stopped it meanwhile
            return
        stop_all([p for p in procs if p.alive()])
        for p in procs:
            p.start()

    def pids(self) -> dict[str, int]:
        """Rank process -> its pid."""
        return {p.name: p.pid for procs in self.ranks.values() for p in procs if p.pid}

    def kill(self, instance: str, rank: int = 0) -> None:
        """For failure drills and tests."""
        self.ranks[instance][rank].signal(signal.SIGKILL)

    def cutter(self) -> Callable[[str, float, int], None]:
        return self.cut_link

    def impairer(self) -> Callable[[str, float, float, str | None], None]:
        return self.impair_link

    def cut_link(self, link: str, seconds: float, after_bytes: int = 0) -> None:
        self._links(link).cut(link, seconds, after_bytes)

    def impair_link(
        self, link: str, seconds: float, loss: float = 1.0, from_cluster: str | None = None
    ) -> None:
        """Partition `link` (loss 1.0) or make it lossy, both ways or from one cluster."""
        self._links(link).impair(link, seconds, loss, from_cluster)

    def _links(self, link: str) -> LinkProcess:
        lp = self.link_process
        if lp is None or link not in lp.links:
            names = ", ".join(lp.links) if lp else "none"
            raise KeyError(f"no emulated link {link!r}; links: {names}")
        return lp

    def stop(self) -> None:
        stop_all([p for procs in self.ranks.values() for p in procs])
        if self.link_process is not None:
            self.link_process.stop()


def _sides(plan: Plan, wiring: Wiring, link: str, addr: str) -> tuple[str, str]:
    """(the senders' cluster, the receiver's) of a data endpoint across `link`."""
    inst = next(i for i, ep in wiring.workers.items() if addr in (ep.kv_flight, ep.handoff))
    server = plan.instance(inst).cluster
    lk = plan.links[link]
    return (lk.b if lk.a == server else lk.a), server


def log_name(process: str) -> str:
    """The log file of a rank process in the run directory (`main/0#1` -> `main-0#1.log`)."""
    return f"{process.replace('/', '-')}.log"
