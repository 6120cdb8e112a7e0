"""The host-CPU model: workers pinned as the runtime pins them, slower while sharing cores."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pddflow.core.cpu_layout import plan_layout
from pddflow.graph.plan import Plan
from pddflow.sim.engine import SimEngine, StepKind

CFS_NICE_STEP = 1.25  # Linux CFS: one nice level is about 1.25x less CPU weight


@dataclass(frozen=True)
class HostSpec:
    cores: float
    pinning: str = "auto"  # as `pddflow deploy --cpu-pinning`
    # (prefill/extend, decode) slowdown while other cores are busy (shared cache and memory bus)
    corun: tuple[float, float] = (1.0, 1.0)
    # per instance: the measured prefill wall over CPU that the CPU share does not explain
    prefill_wall: Mapping[str, float] = field(default_factory=dict)


class CpuShare:
    """Workers pinned to one core group: a busy worker's step is (its threads / the cores it gets)
    x the calibrated step, measured at the workers' thread count on cores of its own."""

    def __init__(self, cores: float, threads: int, host: HostCpus):
        self.cores, self.threads = max(cores, 1e-9), max(1, threads)
        self.engines: list[SimEngine] = []
        self.nice: dict[str, int] = {}
        self.weight: dict[str, float] = {}
        self.prefill_wall: dict[str, float] = {}
        self.busy = 0
        self.host = host

    def attach(self, eng: SimEngine, nice: int = 0, prefill_wall: float = 1.0):
        self.engines.append(eng)
        self.nice[eng.name], self.weight[eng.name] = nice, CFS_NICE_STEP**-nice
        self.prefill_wall[eng.name] = prefill_wall
        eng.slowdown = lambda kind, e=eng: self.factor(e, kind)
        eng.on_busy = self._changed

    def factor(self, eng: SimEngine, kind: StepKind) -> float:
        mine = self.weight[eng.name] * self.threads
        demand = sum(self.weight[e.name] for e in self.engines if e.busy) * self.threads
        given = min(self.threads, self.cores * mine / max(demand, mine))  # cores this engine gets
        f = self.threads / given
        if self.host.corun != (1.0, 1.0) and self.host.others_busy(self):
            f *= self.host.corun[0] if kind is not StepKind.DECODE else self.host.corun[1]
        return f * (self.prefill_wall[eng.name] if kind is StepKind.PREFILL else 1.0)

    def _changed(self, eng: SimEngine) -> None:
        busy = sum(1 for e in self.engines if e.busy)
        if busy == self.busy:
            return
        was, self.busy = self.busy, busy
        for e in self.engines:
            if e is not eng:
                e.replan()
        if (was == 0) != (busy == 0):
            self.host.group_changed(self)

    def to_dict(self) -> dict:
        return {
            "cores": self.cores,
            "threads_per_worker": self.threads,
            "instances": [e.name for e in self.engines],
            "nice": dict(self.nice),
        }


class HostCpus:
    def __init__(self, plan: Plan, spec: HostSpec):
        cores = spec.cores
        lay = plan_layout(plan, list(range(max(1, int(cores)))), spec.pinning)
        self.mode, self.nice, self.spec = lay.mode, lay.nice, spec
        self.corun = tuple(max(1.0, float(x)) for x in spec.corun)
        groups: dict[tuple[int, ...], CpuShare] = {}
        self.share: dict[str, CpuShare] = {}
        for inst in plan.instances:
            key = lay.cpus[inst.id]
            if key not in groups:
                n = float(len(key)) if key else cores
                groups[key] = CpuShare(n, lay.threads[inst.id], self)
            self.share[inst.id] = groups[key]
        self.groups = list(groups.values())

    def attach(self, instance: str, eng: SimEngine) -> None:
        wall = self.spec.prefill_wall.get(instance, 1.0)
        self.share[instance].attach(eng, self.nice[instance], wall)

    def others_busy(self, group: CpuShare) -> bool:
        return any(g.busy for g in self.groups if g is not group)

    def group_changed(self, group: CpuShare) -> None:
        """A group went idle or busy: the other groups' workers re-plan at their co-run factor."""
        if self.corun == (1.0, 1.0):
            return
        for g in self.groups:
            if g is not group:
                for e in g.engines:
                    e.replan()

    def to_dict(self) -> dict:
        return {
            "layout": self.mode,
            "corun": {"prefill": self.corun[0], "decode": self.corun[1]},
            "groups": [g.to_dict() for g in self.groups],
        }
