"""Wiring: where every endpoint of a local deployment listens, decided by the deployer and handed
to every worker as a JSON file."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pddflow.channels.security import TLSConfig
from pddflow.core.channel_kinds import Kind
from pddflow.core.cpu_layout import CpuLayout, host_cores, plan_layout
from pddflow.core.device import LOCAL_KV_CACHE_MIB
from pddflow.core.ports import free_port
from pddflow.graph.plan import OperatorPlan, Plan
from pddflow.runtime.rpc import Credentials
from pddflow.runtime.transports import NETWORK, SHM, incoming, routes


@dataclass
class Endpoints:
    rpc: str  # the worker's control service
    kv_flight: str = ""  # wan_flight receiver (grpc://127.0.0.1:port)
    kv_rdma: str = ""  # rdma_tensor receiver for senders on its host (unix:@name, shared memory)
    kv_rdma_net: str = ""  # and for the others (tcp:host:port; tcp or nixl regions)
    # the network receivers of ranks 1.. of a tensor-parallel instance (rdma_address)
    kv_rdma_ranks: list[str] = field(default_factory=list)
    handoff: str = ""  # token_ids server (127.0.0.1:port)
    tp_init: str = ""  # host:port where rank 0 gathers the instance's ranks (tensor parallel)


@dataclass
class Wiring:
    deployment: str
    plan_json: str
    frontend: str  # the frontend's report service
    workers: dict[str, Endpoints] = field(default_factory=dict)
    auth_token: str = ""  # bearer token of the control plane and every cross-cluster channel
    seed: int = 0
    kv_cache_bytes: int = LOCAL_KV_CACHE_MIB << 20  # per worker, local profile
    leg_timeout_s: float = 60.0  # a leg's default deadline
    tp_timeout_s: float = 60.0  # a collective between an instance's ranks; then the rank is lost
    # real address -> the emulated link's relay, so the link can be cut
    via: dict[str, str] = field(default_factory=dict)
    # the control plane across a link (local backend): a worker's control service as the
    # frontend reaches it, and the frontend's report service as each other cluster reaches it
    control_via: dict[str, str] = field(default_factory=dict)
    report_via: dict[str, str] = field(default_factory=dict)  # cluster -> address
    # deploy --api-servers N: each API process's token service (name -> address), and as each
    # other cluster reaches it (cluster -> name -> address)
    api_servers: dict[str, str] = field(default_factory=dict)
    api_via: dict[str, dict[str, str]] = field(default_factory=dict)
    lease_s: float = 10.0  # the frontend's lease on each worker's legs (frontend/leases.py)
    cpus: dict[str, list[int]] = field(default_factory=dict)  # instance -> cores it is pinned to
    threads: dict[str, int] = field(default_factory=dict)  # instance -> torch threads (0: default)
    nice: dict[str, int] = field(default_factory=dict)  # instance -> priority decrease
    tls_cert: str = ""  # PEM paths for channels with `tls: true`
    tls_key: str = ""
    tls_roots: str = ""  # what this end trusts (default: tls_cert, a self-signed certificate)
    links: dict[str, list[str]] = field(default_factory=dict)
    bind_all: bool = False  # listen on every interface (0.0.0.0), not only the published address
    # how each channel is carried, once instances are placed (channel id -> e.g. "shared memory")
    transports: dict[str, str] = field(default_factory=dict)
    # rdma_tensor: "src>dst" instance pair -> shm | tcp | nixl (rdma_routes.py)
    rdma: dict[str, str] = field(default_factory=dict)
    cache_dir: str = ""  # disk_cache tiers without a `dir` of their own: one subdirectory each
    # "real" (the model's weights) or "modeled" (operators/modeled_engine.py: the device model's
    # time, payloads of kv_scale of the arch's KV bytes, every step time_scale times as long)
    engine: str = "real"
    kv_scale: float = 1.0
    time_scale: float = 1.0

    def disk_cache_dir(self, op: OperatorPlan, instance: str) -> Path:
        """Where `instance`'s disk tier keeps its arena (the same after a restart)."""
        assert op.disk_cache is not None
        base = Path(op.disk_cache.dir).expanduser() if op.disk_cache.dir else Path(self.cache_dir)
        return base / instance.replace("/", "-")

    def bind_host(self, address: str) -> str:
        """Where a server publishing `address` ([scheme://]host:port) listens: that host, or every
        interface when the deployment asked for it."""
        if self.bind_all:
            return "0.0.0.0"
        host = address.rpartition("://")[2].rsplit(":", 1)[0]
        return host.strip("[]")

    def reach(self, address: str) -> str:
        return self.via.get(address, address)

    def control_address(self, instance: str) -> str:
        """Where the frontend reaches `instance`'s control service."""
        rpc = self.workers[instance].rpc
        return self.control_via.get(rpc, rpc)

    def frontend_from(self, cluster: str) -> str:
        """Where a worker in `cluster` reaches the frontend's report service."""
        return self.report_via.get(cluster, self.frontend)

    def api_from(self, cluster: str, name: str) -> str:
        """Where a worker in `cluster` reaches API process `name`'s token service."""
        return self.api_via.get(cluster, {}).get(name, self.api_servers[name])

    def credentials(self) -> Credentials:
        """The control plane's: the deployment's token, mutual TLS when it has a certificate."""
        return Credentials(self.auth_token, self.tls())

    def tls(self) -> TLSConfig | None:
        if not self.tls_cert:
            return None
        return TLSConfig(
            cert_chain=self.tls_cert,
            private_key=self.tls_key,
            root_certs=self.tls_roots or self.tls_cert,
        )

    def plan(self) -> Plan:
        return Plan.from_json(self.plan_json)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @staticmethod
    def load(path: Path) -> Wiring:
        d = json.loads(Path(path).read_text())
        d["workers"] = {k: Endpoints(**v) for k, v in d["workers"].items()}
        return Wiring(**d)


def wire(
    plan: Plan,
    seed: int = 0,
    kv_cache_bytes: int = LOCAL_KV_CACHE_MIB << 20,
    leg_timeout_s: float = 60.0,
    cpus: CpuLayout | None = None,
) -> Wiring:
    """Endpoints for every instance of a (local-scale) plan: a receiver where an edge lands."""
    dep = f"pddflow-{uuid.uuid4().hex[:8]}"
    w = Wiring(
        dep,
        plan.to_json(indent=None),
        f"127.0.0.1:{free_port()}",
        auth_token=secrets.token_hex(16),
        seed=seed,
        kv_cache_bytes=kv_cache_bytes,
        leg_timeout_s=leg_timeout_s,
        lease_s=plan.deploy.lease_s,
    )
    cpus = cpus or plan_layout(plan, host_cores())
    w.cpus = {i: list(c) for i, c in cpus.cpus.items()}
    w.threads, w.nice = dict(cpus.threads), dict(cpus.nice)
    for inst in plan.instances:
        ep = Endpoints(rpc=f"127.0.0.1:{free_port()}")
        if plan.operators[inst.operator].ranks > 1:
            ep.tp_init = f"127.0.0.1:{free_port()}"
        for ch in plan.channels:
            if ch.dst != inst.operator:
                continue
            if ch.kind == Kind.WAN_FLIGHT and not ep.kv_flight:
                ep.kv_flight = f"grpc://127.0.0.1:{free_port()}"
            elif ch.kind == Kind.TOKEN_IDS and not ep.handoff:
                ep.handoff = f"127.0.0.1:{free_port()}"
            if ch.cross_cluster and ch.link:
                addr = (
                    ep.kv_flight
                    if ch.kind == Kind.WAN_FLIGHT
                    else (ep.handoff if ch.kind == Kind.TOKEN_IDS else "")
                )
                if addr and addr not in w.links.setdefault(ch.link, []):
                    w.links[ch.link].append(addr)
        w.workers[inst.id] = ep
    # one host: shared memory, unless an edge asks for a network transport
    w.rdma = routes(plan, {}, nixl=False)
    for inst_id, ep in w.workers.items():
        ranks = plan.operator_of(inst_id).ranks
        place_rdma_receivers(w, inst_id, ep, lambda: f"tcp:127.0.0.1:{free_port()}", ranks)
    return w


def place_rdma_receivers(
    w: Wiring, instance: str, ep: Endpoints, net_address: Callable[[], str], ranks: int = 1
) -> None:
    """The rdma_tensor receivers an instance needs, by how its senders reach it (`w.rdma`): a
    unix socket for those on its host, net_address() for the others; neither when none. Each
    rank of a tensor-parallel instance has its own (rank-to-rank KV)."""
    got = incoming(w.rdma, instance)
    ep.kv_rdma = f"unix:@{w.deployment}-{instance.replace('/', '-')}-kv" if SHM in got else ""
    ep.kv_rdma_net = net_address() if got & set(NETWORK) else ""
    ep.kv_rdma_ranks = [net_address() for _ in range(ranks - 1)] if ep.kv_rdma_net else []


def rdma_address(ep: Endpoints, rank: int, transport: str) -> str:
    """Where rank `rank` of an instance receives rdma_tensor KV sent by `transport`."""
    if transport == SHM:
        return ep.kv_rdma if rank == 0 else f"{ep.kv_rdma}-r{rank}"
    return ep.kv_rdma_net if rank == 0 else ep.kv_rdma_ranks[rank - 1]
