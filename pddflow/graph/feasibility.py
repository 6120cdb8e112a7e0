"""Feasibility first (PDD.md): can each WAN link carry the KV, and how long do transfers take?

Bandwidth: KV bytes per second that must cross each link for a given load, with and without a
decode-side radix cache (DRC: only the uncached share travels). Latency: per request class, the
KV transfer time at P50/P99 from the link's bandwidth (shared with the other flows, processor
sharing: a flow sees 1/(1-utilisation) of its solo time) capped by the declared per-transfer limit
(wan_flight streams x one TCP stream's rate, window/RTT by default), its RTT and its jitter.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pddflow.core.payloads import Payload
from pddflow.graph.load_split import PoolShare, channel_share, pool_shares
from pddflow.graph.plan import Plan

HANDOFF_BYTES_PER_TOKEN = 15  # token IDs on the wire: PDD measures 1.5 KB per 100 tokens


@dataclass(frozen=True)
class Load:
    rps: float = 5.0
    prompt_tokens: int = 65536
    output_tokens: int = 1024
    hit_rate: float = 0.9


@dataclass
class RequestClass:
    name: str
    hit_rate: float
    kv_bytes: float
    transfer_p50_s: float
    transfer_p99_s: float


@dataclass
class LinkReport:
    name: str
    available_gbps: float
    required_gbps: float  # with DRC where the receiving operator keeps one
    required_gbps_without_drc: float
    utilization: float
    transfer_p50_s: float  # the average-hit request
    transfer_p99_s: float
    classes: list[RequestClass] = field(default_factory=list)
    channels: list[str] = field(default_factory=list)
    # the declared transfer limit: one stream's rate (window/RTT unless declared), wan_flight
    # streams per transfer, and their product, the most one transfer gets (0: no cap)
    stream_gbps: float = 0.0
    streams: int = 1
    flow_cap_gbps: float = 0.0


@dataclass
class Feasibility:
    load: Load
    links: list[LinkReport]
    feasible: bool
    problems: list[str]
    notes: list[str]
    pools: list[PoolShare] = field(default_factory=list)  # how the load splits (load_split.py)

    def to_dict(self) -> dict:
        return asdict(self)


def analyze(plan: Plan, load: Load) -> Feasibility:
    kv = plan.model.arch.kv_bytes_per_token
    has_relay = any(v.handoff for v in plan.variants.values())
    problems: list[str] = []
    notes: list[str] = []
    reports = []
    for link in plan.links.values():
        crossing = [c for c in plan.channels if c.link == link.name]
        full = drc = 0.0
        kv_drc = False
        for c in crossing:
            share = channel_share(plan, c.id)
            if c.payload == str(Payload.KV_BLOCKS):
                per_req = load.prompt_tokens * kv
                uses_drc = plan.operators[c.dst].caches_prefixes
                kv_drc |= uses_drc
                full += load.rps * share * per_req
                drc += load.rps * share * per_req * ((1 - load.hit_rate) if uses_drc else 1.0)
            elif c.payload == str(Payload.TOKEN_IDS):
                ids = load.rps * share * load.output_tokens * HANDOFF_BYTES_PER_TOKEN
                full += ids
                drc += ids
        required, without = drc * 8 / 1e9, full * 8 / 1e9
        util = required / link.gbps
        streams = plan.streams(link.name)
        classes = (
            _classes(link, load, kv, util, kv_drc, streams)
            if any(c.payload == str(Payload.KV_BLOCKS) for c in crossing)
            else []
        )
        avg = next((c for c in classes if c.name == "average"), None)
        reports.append(
            LinkReport(
                link.name,
                link.gbps,
                round(required, 3),
                round(without, 3),
                round(util, 4),
                avg.transfer_p50_s if avg else 0.0,
                avg.transfer_p99_s if avg else 0.0,
                classes,
                [c.id for c in crossing],
                round(link.stream_gbps, 3),
                streams,
                round(plan.flow_cap_gbps(link.name), 3),
            )
        )
        if util >= 1.0:
            problems.append(
                f"link {link.name}: needs {required:.1f} Gbps at {load.rps:g} req/s but gives "
                f"{link.gbps:g} Gbps; add bandwidth, raise the hit rate, or lower the load"
            )
        elif util > 0.8:
            notes.append(
                f"link {link.name} runs at {util:.0%} of its bandwidth: "
                "transfers queue and the tail grows"
            )
        if without > link.gbps and required < link.gbps and kv_drc:
            notes.append(
                f"link {link.name}: feasible only with the decode-side radix cache "
                f"({without:.1f} Gbps without it, {required:.1f} Gbps with "
                f"{load.hit_rate:.0%} hits)"
            )
        cold = next((c for c in classes if c.name == "cold"), None)
        if cold and cold.transfer_p99_s > plan.scheduler.ttft_s:
            msg = (
                f"link {link.name}: a cold {load.prompt_tokens}-token prompt's KV takes "
                f"{cold.transfer_p99_s:.1f} s at P99, over the {plan.scheduler.ttft_s:g} s TTFT SLA"
            )
            if has_relay:
                notes.append(msg + "; the relay variant hides it (eager tokens from the relay)")
            else:
                problems.append(msg + "; add a relay variant (p_rld_md) or more bandwidth")
    return Feasibility(
        load, reports, not problems, problems, notes, list(pool_shares(plan).values())
    )


def _classes(link, load: Load, kv: int, util: float, drc: bool, streams: int) -> list[RequestClass]:
    """A transfer gets the link's unused share, at most its streams' cap (as in the simulator)."""
    rate = link.flow_bytes_per_s(streams, 1.0 - util) if util < 1.0 else 0.0
    out = []
    for name, hit in (
        ("cold", 0.0),
        ("average", load.hit_rate),
        ("warm", max(load.hit_rate, 0.95)),
    ):
        if not drc:
            hit = 0.0
        nbytes = load.prompt_tokens * kv * (1 - hit)
        data_s = nbytes / rate if rate > 0 else float("inf")
        p50 = link.transfer_quantile_s(0, 0.5) + data_s
        p99 = link.transfer_quantile_s(0, 0.99) + data_s
        out.append(RequestClass(name, hit, nbytes, round(p50, 4), round(p99, 4)))
    return out
