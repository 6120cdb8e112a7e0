"""A Plan as the policies and the simulator read it: each variant prefill -> (relay) -> main."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from pddflow.core.payloads import Payload
from pddflow.graph.plan import ChannelPlan, Plan, VariantPlan

_KV = str(Payload.KV_BLOCKS)
_IDS = str(Payload.TOKEN_IDS)


@dataclass(frozen=True)
class PathInfo:
    variant: VariantPlan
    prefill: str  # the operator that takes the request and prefills it (prefill, or colocated)
    relay: str | None  # relay operator (decodes first), when the path has one
    main: str  # operator that decodes to the end
    kv_to_main: ChannelPlan | None  # None when prefill == main (colocated)
    handoff: ChannelPlan | None  # token-ID channel relay -> main

    @property
    def name(self) -> str:
        return self.variant.name

    @property
    def colocated(self) -> bool:
        return self.prefill == self.main

    @property
    def has_handoff(self) -> bool:
        return self.relay is not None and self.relay != self.main

    @property
    def singular(self) -> bool:
        return self.variant.singular_traffic

    @property
    def wan_link(self) -> str | None:
        return self.kv_to_main.link if self.kv_to_main is not None else None


class Topology:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.paths: dict[str, PathInfo] = {n: self._path(v) for n, v in plan.variants.items()}

    def _kv(self, src: str, dst: str) -> ChannelPlan | None:
        for c in self.plan.channels_between(src, dst):
            if c.payload == _KV:
                return c
        return None

    def _path(self, v: VariantPlan) -> PathInfo:
        ops = self.plan.operators
        prefill, last = v.path[0], v.path[-1]
        relays = [p for p in v.path[1:] if ops[p].type.relays]
        relay = relays[0] if relays else None
        handoff = None
        if relay is not None and relay != last:
            handoff = next(
                (c for c in self.plan.channels_between(relay, last) if c.payload == _IDS), None
            )
        return PathInfo(
            v,
            prefill,
            relay,
            last,
            self._kv(prefill, last) if last != prefill else None,
            handoff,
        )

    @cached_property
    def cached_operators(self) -> tuple[str, ...]:
        return tuple(name for name, op in self.plan.operators.items() if op.caches_prefixes)

    @cached_property
    def pools(self) -> dict[str, list[PathInfo]]:
        """Finishing decoder -> the non-singular variants that end there, in plan order."""
        out: dict[str, list[PathInfo]] = {}
        for p in self.paths.values():
            if not p.singular:
                out.setdefault(p.main, []).append(p)
        return out

    @cached_property
    def cache_links(self) -> dict[str, str]:
        """Main with a radix cache -> the link its KV crosses: the bytes its cache spares
        (the planner grows such a pool while that link is busy)."""
        return {
            p.main: p.wan_link
            for p in self.paths.values()
            if p.wan_link is not None and p.main in self.cached_operators
        }

    @cached_property
    def singular_paths(self) -> list[PathInfo]:
        return [p for p in self.paths.values() if p.singular]

    @cached_property
    def has_relay_path(self) -> bool:
        return any(p.has_handoff for p in self.paths.values())

    def rdma_bytes_per_s(self, src: str, dst: str) -> float:
        """Intra-cluster KV bandwidth: each device of the smaller instance drives its own NIC."""
        a, b = self.plan.operators[src], self.plan.operators[dst]
        gbps = self.plan.clusters[a.cluster].rdma_gbps or 100.0
        return min(a.devices_per_replica, b.devices_per_replica) * gbps * 1e9 / 8
