"""Placement of a plan's instances on a Ray cluster, before anything starts: what each instance
asks Ray for, which instances must share a node, and whether the cluster has it all.

The convention (docs/deploy-ray.md): a Ray node that serves graph cluster X carries the custom
resource `pddflow_cluster_X` (any positive amount). An instance of cluster X asks for a sliver of
it, so it lands on one of X's nodes, plus its devices: `GPU: devices` where X's nodes have GPUs,
one CPU otherwise. Instances joined by an `rdma_tensor` edge go wherever their cluster has room:
the backend then gives each pair shared memory when both ends share a host, else a network
transport (`runtime/transports.py`). Only an edge that asks for `transport: shm` keeps its ends on
one node (a STRICT_PACK placement group).

Pure functions of the plan and a table of nodes: unit-tested without Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pddflow.core.channel_kinds import Kind
from pddflow.graph.diagnostics import Diagnostic
from pddflow.graph.plan import Plan

CLUSTER_SHARE = 0.001  # of `pddflow_cluster_X` per instance: a node with N carries 1000*N
ACCELERATOR_SHARE = 0.001


def cluster_resource(cluster: str) -> str:
    return f"pddflow_cluster_{cluster}"


@dataclass(frozen=True)
class Node:
    node_id: str
    ip: str
    resources: dict[str, float]  # totals the node was started with


@dataclass
class Group:
    """Instances placed together: one placement group, one bundle per instance."""

    cluster: str
    instances: list[str]
    bundles: list[dict[str, float]] = field(default_factory=list)

    def need(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for b in self.bundles:
            for k, v in b.items():
                out[k] = out.get(k, 0.0) + v
        return out


def nodes_of(cluster: str, nodes: list[Node]) -> list[Node]:
    r = cluster_resource(cluster)
    return [n for n in nodes if n.resources.get(r, 0) > 0]


def demand(
    plan: Plan, instance: str, nodes: list[Node], accelerators: dict[str, str]
) -> dict[str, float]:
    """The Ray resources one instance asks for, in one bundle (one node): a device per rank
    process, GPUs where its cluster's nodes have them, else CPUs."""
    inst = plan.instance(instance)
    ranks = float(plan.operator_of(instance).ranks)
    out = {cluster_resource(inst.cluster): CLUSTER_SHARE}
    if any(n.resources.get("GPU", 0) > 0 for n in nodes_of(inst.cluster, nodes)):
        out["GPU"] = ranks
    else:
        out["CPU"] = ranks
    if inst.device in accelerators:
        out[f"accelerator_type:{accelerators[inst.device]}"] = ACCELERATOR_SHARE
    return out


def groups(plan: Plan, nodes: list[Node], accelerators: dict[str, str]) -> list[Group]:
    """Instances joined by rdma_tensor edges with `transport: shm` (transitively) form one
    group; every other instance is a group of its own. Sorted as the plan lists instances."""
    parent = {i.id: i.id for i in plan.instances}

    def root(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for ch in plan.channels:
        if ch.kind != Kind.RDMA_TENSOR or ch.params.get("transport") != "shm":
            continue
        for a in plan.operators[ch.src].instances:
            for b in plan.operators[ch.dst].instances:
                parent[root(a)] = root(b)
    out: dict[str, Group] = {}
    for inst in plan.instances:
        g = out.setdefault(root(inst.id), Group(inst.cluster, []))
        g.instances.append(inst.id)
        g.bundles.append(demand(plan, inst.id, nodes, accelerators))
    return list(out.values())


def _fmt(x: float) -> str:
    return f"{x:g}"


def problems(plan: Plan, nodes: list[Node], accelerators: dict[str, str]) -> list[tuple[str, str]]:
    """(cluster, message) for everything the plan asks for that the Ray cluster lacks."""
    out: list[tuple[str, str]] = []
    gs = groups(plan, nodes, accelerators)
    for cluster in plan.clusters:
        mine = [g for g in gs if g.cluster == cluster]
        if not mine:
            continue
        res = cluster_resource(cluster)
        carriers = nodes_of(cluster, nodes)
        if not carriers:
            out.append(
                (
                    cluster,
                    f"cluster {cluster!r}: no live Ray node carries the resource {res!r} "
                    f"(start its nodes with: ray start ... --resources '{{\"{res}\": 1}}')",
                )
            )
            continue
        need: dict[str, float] = {}
        for g in mine:
            for k, v in g.need().items():
                need[k] = need.get(k, 0.0) + v
        n_inst = sum(len(g.instances) for g in mine)
        for k, v in sorted(need.items()):
            have = sum(n.resources.get(k, 0.0) for n in carriers)
            if v > have + 1e-9:
                out.append(
                    (
                        cluster,
                        f"cluster {cluster!r} needs {k}: {_fmt(v)} for its {n_inst} instance(s), "
                        f"its {len(carriers)} Ray node(s) with {res!r} have {_fmt(have)}: "
                        f"{_fmt(v - have)} missing",
                    )
                )
        if any(c == cluster for c, _ in out):
            continue
        for g in mine:
            want = g.need()
            if not any(
                all(n.resources.get(k, 0.0) + 1e-9 >= v for k, v in want.items()) for n in carriers
            ):
                what = ", ".join(f"{k}: {_fmt(v)}" for k, v in sorted(want.items()))
                if len(g.instances) == 1:  # one instance's ranks: a tensor-parallel group
                    inst = g.instances[0]
                    why = (
                        f"{inst}'s {plan.operator_of(inst).ranks} ranks must run on one node, but "
                        f"no Ray node with {res!r} has {what} (set fewer with the graph's local: "
                        "{devices_per_replica: ...})"
                    )
                else:
                    why = (
                        f"{', '.join(g.instances)} share rdma_tensor edges with transport: shm "
                        f"and must run on one node, but no Ray node with {res!r} has {what} "
                        "(transport: auto lets them use tcp between nodes)"
                    )
                out.append((cluster, f"cluster {cluster!r}: {why}"))
    return out


def diagnostics(plan: Plan, found: list[tuple[str, str]]) -> list[Diagnostic]:
    """`FILE:LINE:COL: message` at each cluster's definition in the graph file, as `validate`."""
    line = col = 1
    src = None
    if plan.source:
        try:
            from pddflow.graph.yaml_source import read_yaml

            src = read_yaml(plan.source)
        except OSError:
            src = None
    out = []
    for cluster, msg in found:
        if src is not None and src.data is not None:
            try:
                line, col = src.where(("clusters", cluster), key=True)
            except (KeyError, IndexError, TypeError):
                line, col = 1, 1
        out.append(Diagnostic(plan.source or "<graph>", line, col, msg))
    return out
