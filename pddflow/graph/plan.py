"""The compiled Plan: what the runtime deploys and the simulator replays.

Frozen and JSON-serialisable (`to_json` / `from_json`). Built by `pddflow.graph.compile`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Any

from pddflow.core.arch import ModelArch
from pddflow.core.channel_kinds import Kind
from pddflow.core.device import LOCAL_DISK_CACHE_MIB, LOCAL_HOST_CACHE_MIB, DeviceClass
from pddflow.core.link import Jitter, LinkModel
from pddflow.core.operator_types import (
    DEFAULT_CHUNK_TOKENS,
    DEFAULT_MAX_BATCH,
    OPERATOR_TYPES,
    OperatorType,
)


def rank_name(instance: str, rank: int) -> str:
    """One rank process of an instance: the leader (rank 0) goes by the instance's name."""
    return instance if rank == 0 else f"{instance}#{rank}"


@dataclass(frozen=True)
class ModelPlan:
    weights: str
    arch: ModelArch
    max_context: int
    block_size: int


@dataclass(frozen=True)
class ClusterPlan:
    name: str
    devices: dict[str, int]
    rdma_gbps: float


@dataclass(frozen=True)
class Instance:
    id: str  # "<operator>/<index>", unique in the plan
    operator: str
    index: int
    cluster: str
    device: str
    devices: int  # devices this instance spans


@dataclass(frozen=True)
class Shape:
    """What one replica occupies: a device class, how many, and the KV memory that leaves."""

    device: str
    devices_per_replica: int
    kv_budget_bytes: float


@dataclass(frozen=True)
class HostCachePlan:
    """A host-memory KV tier under an operator's cache (graph: `operators.X.host_cache`)."""

    gib: float  # per replica; 0: declared (priced, searchable) but none bought
    max_gib: float  # the most `pddflow size` may buy per replica
    usd_per_gib_hour: float
    gbytes_per_s: float  # host -> HBM, per replica

    @property
    def bytes(self) -> float:
        return self.gib * 2**30

    @property
    def usd_per_replica_hour(self) -> float:
        return self.gib * self.usd_per_gib_hour


@dataclass(frozen=True)
class DiskCachePlan:
    """A local-disk KV tier under an operator's cache (graph: `operators.X.disk_cache`)."""

    gib: float  # per replica
    usd_per_gib_hour: float
    gbytes_per_s: float  # disk -> HBM, per replica
    dir: str | None = None  # None: the deployment's run directory
    persist: bool = False

    @property
    def bytes(self) -> float:
        return self.gib * 2**30

    @property
    def usd_per_replica_hour(self) -> float:
        return self.gib * self.usd_per_gib_hour


@dataclass(frozen=True)
class LocalCache:
    """The local profile's sizes of one operator's KV pool and tiers, MiB (None: the default)."""

    kv: float | None = None
    host: float | None = None
    disk: float | None = None


def _local_cache(op: OperatorPlan, local: LocalCache) -> OperatorPlan:
    """An operator's KV sizes on one machine: its pool (when the profile gives one) and its tiers,
    a host tier only where the graph buys one (gib > 0) or the profile sizes it."""
    host, disk = op.host_cache, op.disk_cache
    if host is not None:
        mib = local.host or (LOCAL_HOST_CACHE_MIB if host.gib > 0 else 0)
        host = replace(host, gib=mib / 1024, max_gib=max(host.max_gib, mib / 1024))
    if disk is not None:
        disk = replace(disk, gib=(local.disk or LOCAL_DISK_CACHE_MIB) / 1024)
    kv = float(local.kv * 2**20) if local.kv else op.kv_budget_bytes
    return replace(op, host_cache=host, disk_cache=disk, kv_budget_bytes=kv)


@dataclass(frozen=True)
class OperatorPlan:
    name: str
    op_type: str
    role: str  # prefill | decode | both
    cluster: str
    device: str
    replicas: int
    devices_per_replica: int
    params: dict[str, Any]  # every declared parameter, defaults filled in
    kv_budget_bytes: float  # per replica: device memory minus weights, at production scale
    instances: tuple[str, ...] = ()
    choices: tuple[Shape, ...] = ()  # other shapes `pddflow size` may pick (the graph's `choices`)
    host_cache: HostCachePlan | None = None
    disk_cache: DiskCachePlan | None = None
    local_ranks: int = 0  # the local profile's layout (set by Plan.scaled_to_local; 0: none)

    @property
    def ranks(self) -> int:
        """Rank processes (the tensor-parallel degree) one instance runs as when deployed: the
        local profile's layout, else devices_per_replica."""
        return self.local_ranks or self.devices_per_replica

    @property
    def type(self) -> OperatorType:
        """The registry's entry for `op_type`: what the operator does is asked of it."""
        return OPERATOR_TYPES.get(self.op_type)

    @property
    def shape(self) -> Shape:
        return Shape(self.device, self.devices_per_replica, self.kv_budget_bytes)

    def shapes(self) -> tuple[Shape, ...]:
        """The declared shape first, then the graph's other choices."""
        return (self.shape, *self.choices)

    def reshaped(self, shape: Shape) -> OperatorPlan:
        return replace(
            self,
            device=shape.device,
            devices_per_replica=shape.devices_per_replica,
            kv_budget_bytes=shape.kv_budget_bytes,
        )

    # The compiler fills every declared parameter; these are the facts every consumer reads, with
    # the one default for operator types that do not declare them.
    @property
    def max_batch(self) -> int:
        return int(self.params.get("max_batch", DEFAULT_MAX_BATCH))

    @property
    def chunk_tokens(self) -> int:
        return int(self.params.get("chunk_tokens", DEFAULT_CHUNK_TOKENS))

    @property
    def expert_parallel(self) -> bool:
        return bool(self.params.get("expert_parallel"))

    @property
    def caches_prefixes(self) -> bool:
        """A prefix cache on the entry side, or a decode-side radix cache (DRC)."""
        return bool(self.params.get("radix_cache") or self.params.get("prefix_cache"))

    @property
    def host_cache_gib(self) -> float:
        return self.host_cache.gib if self.host_cache is not None else 0.0

    def usd_per_replica_hour(self, device: DeviceClass) -> float:
        """One replica's devices plus its cache tiers."""
        return self.devices_per_replica * device.usd_per_hour + self.tiers_usd_per_replica_hour

    @property
    def tiers_usd_per_replica_hour(self) -> float:
        host = self.host_cache.usd_per_replica_hour if self.host_cache is not None else 0.0
        disk = self.disk_cache.usd_per_replica_hour if self.disk_cache is not None else 0.0
        return host + disk


@dataclass(frozen=True)
class ChannelPlan:
    id: str  # "src.port->dst.port"
    kind: str
    payload: str
    src: str  # operator
    src_port: str
    dst: str
    dst_port: str
    cross_cluster: bool
    link: str | None  # the link crossed, when cross_cluster
    params: dict[str, Any]


@dataclass(frozen=True)
class VariantPlan:
    name: str
    path: tuple[str, ...]
    channels: tuple[str, ...]  # every edge between operators of the path, in path order
    handoff: str | None  # one_shot | catch_up | adaptive, when the path has a relay
    catch_up_tokens: int
    min_extend_tokens: int  # no smaller extend on main unless the relay's sequence finished
    singular_traffic: bool
    expected_share: float | None


@dataclass(frozen=True)
class SchedulerPlan:
    policy: str
    ttft_s: float
    tpot_ms: float
    params: dict[str, Any]


@dataclass(frozen=True)
class DeployPlan:
    """The graph's `deploy:` section: where `pddflow deploy` runs the instances (its flags win)."""

    backend: str = "local"  # local | ray
    address: str | None = None  # the Ray cluster's (default: RAY_ADDRESS, else 'auto')
    namespace: str = "pddflow"
    bind: str = "node"  # node | all (ray: endpoints listen on every interface)
    accelerators: dict[str, str] = field(default_factory=dict)  # device class -> Ray type
    frontend_cluster: str = ""  # where the API and the deployer run (compile: the first cluster)
    lease_s: float = 10.0  # the frontend's lease on a worker's legs (frontend/leases.py)


@dataclass(frozen=True)
class AutoscalePlan:
    """The graph's `autoscale:` section (pddflow/planner)."""

    enabled: bool = False
    min_replicas: dict[str, int] = field(default_factory=dict)  # production; default 1
    interval_s: float = 5.0
    target_utilization: float = 0.7
    scale_down_after_s: float = 30.0
    startup_s: float = 60.0


@dataclass(frozen=True)
class Plan:
    name: str
    source: str
    model: ModelPlan
    device_classes: dict[str, DeviceClass]
    clusters: dict[str, ClusterPlan]
    links: dict[str, LinkModel]
    operators: dict[str, OperatorPlan]
    instances: tuple[Instance, ...]
    channels: tuple[ChannelPlan, ...]
    variants: dict[str, VariantPlan]
    scheduler: SchedulerPlan
    local_replicas: dict[str, int] = field(default_factory=dict)
    # live scaling's bound per operator (local profile): instances wired, not all started
    local_max_replicas: dict[str, int] = field(default_factory=dict)
    local_scheduler_params: dict[str, Any] = field(default_factory=dict)
    local_devices: dict[str, int] = field(default_factory=dict)  # the local profile's layout
    local_cache_mib: dict[str, LocalCache] = field(default_factory=dict)  # the local KV sizes
    profile: str = "production"  # or "local" after scaled_to_local()
    deploy: DeployPlan = field(default_factory=DeployPlan)
    autoscale: AutoscalePlan = field(default_factory=AutoscalePlan)

    # ---- queries the runtime and simulator use -------------------------------------------------
    @property
    def frontend_cluster(self) -> str:
        """Where the API frontend and the deployer run."""
        return self.deploy.frontend_cluster or next(iter(self.clusters))

    def link_between(self, a: str, b: str) -> str | None:
        """The declared link joining clusters a and b (None: the same cluster, or no link)."""
        if a == b:
            return None
        return next((n for n, lk in self.links.items() if {lk.a, lk.b} == {a, b}), None)

    def initial_instances(self) -> list[str]:
        """The instances a deployment starts: each operator's first `replicas` (the rest wait
        for live scaling)."""
        return [i for op in self.operators.values() for i in op.instances[: op.replicas]]

    def scalable(self) -> bool:
        return any(len(op.instances) > op.replicas for op in self.operators.values())

    def pool_bounds(self) -> dict[str, tuple[int, int]]:
        """Each operator's replicas the planner may pick: 1..its instances wired (local profile),
        or autoscale.min_replicas..replicas (production)."""
        if self.profile == "local":
            return {name: (1, len(op.instances)) for name, op in self.operators.items()}
        return {
            name: (min(self.autoscale.min_replicas.get(name, 1), op.replicas), op.replicas)
            for name, op in self.operators.items()
        }

    def channel(self, channel_id: str) -> ChannelPlan:
        for ch in self.channels:
            if ch.id == channel_id:
                return ch
        raise KeyError(channel_id)

    def channels_between(self, src: str, dst: str) -> list[ChannelPlan]:
        return [c for c in self.channels if c.src == src and c.dst == dst]

    @cached_property
    def _instance_by_id(self) -> dict[str, Instance]:
        return {i.id: i for i in self.instances}

    def instance(self, instance_id: str) -> Instance:
        try:
            return self._instance_by_id[instance_id]
        except KeyError:
            raise KeyError(f"{self.name}: no instance {instance_id!r}") from None

    def operator_of(self, instance_id: str) -> OperatorPlan:
        return self.operators[self.instance(instance_id).operator]

    def rank_processes(self, instance_id: str) -> list[str]:
        """The names of an instance's rank processes, its leader (rank 0) first."""
        return [rank_name(instance_id, r) for r in range(self.operator_of(instance_id).ranks)]

    def streams(self, link: str) -> int:
        """The most `streams` any wan_flight channel across `link` declares (1 without one)."""
        return max(
            (
                int(c.params.get("streams", 1))
                for c in self.channels
                if c.link == link and c.kind == Kind.WAN_FLIGHT
            ),
            default=1,
        )

    def flow_cap_gbps(self, link: str) -> float:
        """The most one KV transfer across `link` gets: streams x the link's stream rate (0: no
        cap but the link). `plan`'s transfer times and the simulator's WAN both use it."""
        return self.links[link].flow_cap_gbps(self.streams(link))

    def cost_per_hour(self) -> float:
        """Price of every device the operators occupy (not idle devices in the clusters) and of
        their host cache tiers."""
        return (
            sum(
                op.replicas * op.devices_per_replica * self.device_classes[op.device].usd_per_hour
                for op in self.operators.values()
            )
            + self.host_cache_cost_per_hour()
        )

    def host_cache_cost_per_hour(self) -> float:
        """Every cache tier's price (host memory and disk)."""
        return sum(op.replicas * op.tiers_usd_per_replica_hour for op in self.operators.values())

    def scaled_to_local(self) -> Plan:
        """The same plan with the `local` profile's replica counts (default 1 per operator), rank
        processes per instance (default: the operator's devices_per_replica), scheduler parameters
        and KV sizes (`local.cache_mib`: the device pool, and the tiers at their local sizes);
        devices_per_replica itself stays the production shape the simulator times."""
        ops = {}
        for name, op in self.operators.items():
            n = self.local_replicas.get(name, 1)
            ranks = self.local_devices.get(name, op.devices_per_replica)
            # every instance live scaling may start is wired from the start; `replicas` of them run
            ids = tuple(f"{name}/{i}" for i in range(max(n, self.local_max_replicas.get(name, n))))
            op = replace(op, replicas=n, instances=ids, local_ranks=ranks)
            ops[name] = _local_cache(op, self.local_cache_mib.get(name, LocalCache()))
        params = {**self.scheduler.params, **self.local_scheduler_params}
        return replace(
            self,
            operators=ops,
            instances=_instances(ops),
            scheduler=replace(self.scheduler, params=params),
            profile="local",
        )

    def to_networkx(self) -> Any:
        """The plan as a networkx MultiDiGraph: operators as nodes (with their placement), one
        edge per channel keyed by channel id (with kind, payload, link). Imported on demand."""
        import networkx as nx

        g = nx.MultiDiGraph(name=self.name)
        for op in self.operators.values():
            g.add_node(
                op.name,
                op_type=op.op_type,
                role=op.role,
                cluster=op.cluster,
                device=op.device,
                replicas=op.replicas,
            )
        for c in self.channels:
            g.add_edge(
                c.src,
                c.dst,
                key=c.id,
                kind=c.kind,
                payload=c.payload,
                link=c.link,
                cross_cluster=c.cross_cluster,
            )
        return g

    # ---- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Plan:
        links = {}
        for k, v in d["links"].items():
            links[k] = LinkModel(**{**v, "jitter": Jitter(**v["jitter"])})
        m = d["model"]
        return Plan(
            name=d["name"],
            source=d["source"],
            model=ModelPlan(
                m["weights"], ModelArch(**m["arch"]), m["max_context"], m["block_size"]
            ),
            device_classes={k: DeviceClass(**v) for k, v in d["device_classes"].items()},
            clusters={k: ClusterPlan(**v) for k, v in d["clusters"].items()},
            links=links,
            operators={
                k: OperatorPlan(
                    **{
                        **v,
                        "instances": tuple(v["instances"]),
                        "choices": tuple(Shape(**c) for c in v.get("choices", ())),
                        "host_cache": HostCachePlan(**v["host_cache"])
                        if v.get("host_cache")
                        else None,
                        "disk_cache": DiskCachePlan(**v["disk_cache"])
                        if v.get("disk_cache")
                        else None,
                    }
                )
                for k, v in d["operators"].items()
            },
            instances=tuple(Instance(**i) for i in d["instances"]),
            channels=tuple(ChannelPlan(**c) for c in d["channels"]),
            variants={
                k: VariantPlan(**{**v, "path": tuple(v["path"]), "channels": tuple(v["channels"])})
                for k, v in d["variants"].items()
            },
            scheduler=SchedulerPlan(**d["scheduler"]),
            local_replicas=dict(d.get("local_replicas", {})),
            local_max_replicas=dict(d.get("local_max_replicas", {})),
            local_scheduler_params=dict(d.get("local_scheduler_params", {})),
            local_devices=dict(d.get("local_devices", {})),
            local_cache_mib={k: LocalCache(**v) for k, v in d.get("local_cache_mib", {}).items()},
            profile=d.get("profile", "production"),
            deploy=DeployPlan(**d.get("deploy", {})),
            autoscale=AutoscalePlan(**d.get("autoscale", {})),
        )

    @staticmethod
    def from_json(text: str) -> Plan:
        return Plan.from_dict(json.loads(text))


def _instances(ops: dict[str, OperatorPlan]) -> tuple[Instance, ...]:
    return tuple(
        Instance(f"{op.name}/{i}", op.name, i, op.cluster, op.device, op.devices_per_replica)
        for op in ops.values()
        for i in range(len(op.instances))
    )
