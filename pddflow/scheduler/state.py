"""Everything a policy reads besides the request: cache mirrors, instance loads, link estimates."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pddflow.core.cache_tiers import TIER_NAMES
from pddflow.graph.plan import Plan
from pddflow.scheduler.features import InstanceLoad, LinkEstimate
from pddflow.scheduler.mirror import CacheMirror
from pddflow.scheduler.topology import Topology


@dataclass
class SchedulerState:
    mirrors: dict[str, CacheMirror] = field(default_factory=dict)
    loads: dict[str, InstanceLoad] = field(default_factory=dict)
    links: dict[str, LinkEstimate] = field(default_factory=dict)  # by link name
    # prefill instance -> measured prefill seconds per uncached token (scheduler/prefill_rate.py)
    prefill_s_per_token: dict[str, float] = field(default_factory=dict)
    # cached instance -> tier below the device (1 host memory, 2 disk) -> seconds per byte a hit
    # there takes to load: the graph's bandwidth until the instance reports its measured rate
    tier_s_per_byte: dict[str, dict[int, float]] = field(default_factory=dict)

    @classmethod
    def for_plan(cls, plan: Plan) -> SchedulerState:
        topo = Topology(plan)
        mirrors = {
            i.id: CacheMirror(i.id) for i in plan.instances if i.operator in topo.cached_operators
        }
        loads = {
            i.id: InstanceLoad(max_batch=plan.operators[i.operator].max_batch)
            for i in plan.instances
        }
        links = {name: LinkEstimate.from_model(link) for name, link in plan.links.items()}
        tiers = {}
        for i in plan.instances:
            op = plan.operators[i.operator]
            declared = {1: op.host_cache, 2: op.disk_cache}
            rates = {t: 1 / (c.gbytes_per_s * 1e9) for t, c in declared.items() if c is not None}
            if rates and i.id in mirrors:
                tiers[i.id] = rates
        return cls(mirrors, loads, links, {}, tiers)

    def measured_tiers(self, instance: str, tiers: Iterable) -> None:
        """An instance's TierStats (name, loaded_bytes, load_s): each tier's measured load rate."""
        for t in tiers:
            if t.loaded_bytes and t.tier in TIER_NAMES:
                rates = self.tier_s_per_byte.setdefault(instance, {})
                rates[TIER_NAMES.index(t.tier)] = t.load_s / t.loaded_bytes

    def mirror(self, instance: str) -> CacheMirror | None:
        return self.mirrors.get(instance)

    def load(self, instance: str) -> float:
        ld = self.loads.get(instance)
        return ld.load if ld is not None else 0.0

    def set_load(self, instance: str, load: InstanceLoad) -> None:
        self.loads[instance] = load

    def set_link(self, estimate: LinkEstimate) -> None:
        self.links[estimate.name] = estimate
