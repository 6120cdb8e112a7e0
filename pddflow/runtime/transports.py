"""How each channel is carried once every instance has a host. Each rdma_tensor sender -> receiver
pair of instances gets shared memory when both ends share a host (the same node IP; on the local
backend always), else the edge's network transport (NIXL where installed, else tcp), unless the
edge's `transport` param names one; the others go over TCP, with TLS where the channel asks (the
ray backend asks it on every cross-cluster edge). And how /health and `pddflow plan` say it.

Pure functions of the plan and a table instance -> host IP: unit-tested without any process.
"""

from __future__ import annotations

from dataclasses import replace

from pddflow.core.channel_kinds import Kind
from pddflow.graph.plan import ChannelPlan, Plan

SHM, TCP, NIXL = "shm", "tcp", "nixl"
NETWORK = (TCP, NIXL)
# `pddflow plan`, ray backend, transport auto: the hosts are not known before placement
PLANNED_RAY_AUTO = "shared memory where ends share a host, else tcp (nixl where installed)"


def pair(src: str, dst: str) -> str:
    """The key of one sender -> receiver pair of instances in `Wiring.rdma`."""
    return f"{src}>{dst}"


def route(ch: ChannelPlan, src: str, dst: str, host_of: dict[str, str], nixl: bool) -> str:
    """shm, tcp or nixl for src -> dst on edge ch. host_of lacks an instance: this host."""
    want = ch.params.get("transport", "auto")
    same = host_of.get(src, "") == host_of.get(dst, "")
    if want == SHM and not same:
        raise ValueError(
            f"rdma_tensor edge {ch.id}: transport shm needs {src} and {dst} on one host, but they "
            f"are on {host_of.get(src)} and {host_of.get(dst)}; set transport: auto (or tcp)"
        )
    if want != "auto":
        return want
    if same:
        return SHM
    return NIXL if nixl else TCP


def routes(plan: Plan, host_of: dict[str, str], nixl: bool) -> dict[str, str]:
    """pair(src, dst) -> transport for every pair of instances an rdma_tensor edge joins."""
    out: dict[str, str] = {}
    for ch in plan.channels:
        if ch.kind != Kind.RDMA_TENSOR:
            continue
        for a in plan.operators[ch.src].instances:
            for b in plan.operators[ch.dst].instances:
                out[pair(a, b)] = route(ch, a, b, host_of, nixl)
    return out


def incoming(rdma: dict[str, str], dst: str) -> set[str]:
    """The transports dst's senders reach it by: a receiver per kind (shm; one network)."""
    return {t for key, t in rdma.items() if key.split(">", 1)[1] == dst}


def label(ch: ChannelPlan, transport: str, same_host: bool) -> str:
    """What one pair got, as /health says it: `shared memory`, `tcp (cross-host, checksummed)`."""
    if transport == SHM:
        return "shared memory"
    # "auto" and any algorithm both mean checksums over a wire; "" turned them off
    sums = ", checksummed" if ch.params.get("checksum", "auto") else ""
    return f"{transport} ({'same host' if same_host else 'cross-host'}{sums})"


def channel_label(
    plan: Plan, ch: ChannelPlan, rdma: dict[str, str], host_of: dict[str, str]
) -> str:
    """One string per edge: what every pair got, or per receiver (`shared memory to relay/0, tcp
    (cross-host, checksummed) to relay/1`) where an operator's instances are split, or per pair
    where even one receiver is reached two ways."""
    pairs = []
    for a in plan.operators[ch.src].instances:
        for b in plan.operators[ch.dst].instances:
            same = host_of.get(a, "") == host_of.get(b, "")
            pairs.append((a, b, label(ch, rdma.get(pair(a, b), SHM), same)))
    kinds = {x for _, _, x in pairs}
    if len(kinds) <= 1:
        return kinds.pop() if kinds else "shared memory"
    by_dst: dict[str, set[str]] = {}
    for _, b, x in pairs:
        by_dst.setdefault(b, set()).add(x)
    if all(len(v) == 1 for v in by_dst.values()):
        return ", ".join(f"{next(iter(v))} to {b}" for b, v in by_dst.items())
    return ", ".join(f"{x} {a}->{b}" for a, b, x in pairs)


def planned(ch: ChannelPlan, backend: str) -> str:
    """`pddflow plan`: how an rdma_tensor edge will be carried, before placement."""
    want = ch.params.get("transport", "auto")
    if want == SHM:
        return "shared memory" + (" (ends placed on one node)" if backend == "ray" else "")
    if want in NETWORK:
        return want + (" (checksummed)" if ch.params.get("checksum", "auto") else "")
    return "shared memory" if backend == "local" else PLANNED_RAY_AUTO


def transports(
    plan: Plan, host_of: dict[str, str], rdma: dict[str, str] | None = None
) -> dict[str, str]:
    """How each channel is carried once every instance has a host (its node IP; none: one host):
    rdma_tensor as `rdma` routed each pair (`routes`), the others TCP, with TLS where the
    channel asks."""
    out = {}
    if rdma is None:
        rdma = routes(plan, host_of, nixl=False)
    for ch in plan.channels:
        tls = "+TLS" if ch.params.get("tls") else ""
        token = " + token" if ch.cross_cluster else ""
        if ch.kind == Kind.RDMA_TENSOR:
            out[ch.id] = channel_label(plan, ch, rdma, host_of)
        elif ch.kind == Kind.WAN_FLIGHT:
            out[ch.id] = f"arrow flight over TCP{tls}{token}"
        elif ch.kind == Kind.TOKEN_IDS:
            out[ch.id] = f"TCP{tls}{token}"
        else:
            out[ch.id] = ch.kind
    return out


def secure_cross_cluster(plan: Plan, emulate: bool) -> Plan:
    """The ray backend's defaults: TLS on every cross-cluster edge (the deployment's token is
    always on them); the WAN emulated only when asked (--wan-gbps), the network being real."""
    chans = tuple(
        replace(ch, params={**ch.params, "tls": True, "emulate": emulate and ch.params["emulate"]})
        if ch.cross_cluster
        else ch
        for ch in plan.channels
    )
    return replace(plan, channels=chans)


def planned_transports(plan: Plan) -> list[dict[str, str]]:
    """For `pddflow plan`: how each channel is carried by each backend."""
    local = transports(plan, {})
    ray = transports(secure_cross_cluster(plan, emulate=False), {})
    return [
        {
            "channel": ch.id,
            "kind": ch.kind,
            "local": planned(ch, "local")
            if ch.kind == Kind.RDMA_TENSOR
            else local[ch.id] + (" (emulated link)" if ch.params.get("emulate") else ""),
            "ray": planned(ch, "ray") if ch.kind == Kind.RDMA_TENSOR else ray[ch.id],
        }
        for ch in plan.channels
    ]
