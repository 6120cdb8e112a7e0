"""Everything a policy reads besides the request: cache mirrors, instance loads, link estimates."""

from __future__ import annotations

from dataclasses import dataclass, field

from pddflow.graph.plan import Plan
from pddflow.scheduler.features import InstanceLoad, LinkEstimate
from pddflow.scheduler.mirror import CacheMirror
from pddflow.scheduler.topology import Topology


@dataclass
class SchedulerState:
    mirrors: dict[str, CacheMirror] = field(default_factory=dict)
    loads: dict[str, InstanceLoad] = field(default_factory=dict)
    links: dict[str, LinkEstimate] = field(default_factory=dict)  # by link name
    # entry instance -> measured prefill seconds per uncached token (scheduler/prefill_rate.py)
    prefill_s_per_token: dict[str, float] = field(default_factory=dict)

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
        return cls(mirrors, loads, links, {})

    def mirror(self, instance: str) -> CacheMirror | None:
        return self.mirrors.get(instance)

    def load(self, instance: str) -> float:
        ld = self.loads.get(instance)
        return ld.load if ld is not None else 0.0

    def set_load(self, instance: str, load: InstanceLoad) -> None:
        self.loads[instance] = load

    def set_link(self, estimate: LinkEstimate) -> None:
        self.links[estimate.name] = estimate
