"""`simulate --planner`: the simulated pools resized as the runtime's are (docs/simulator.md,
The planner). Every `interval_s` each pool is measured (the prompts that arrived at it, the
sequences it holds), one replica's capacity is taken from its device model (what `size` times),
and the planner's count is applied: up, a parked instance starts and serves `startup_s` later with
an empty cache; down, the highest-numbered serving instance drains (no new work) and is parked
once it holds nothing. An instance counts device-seconds from its start to its parking."""

from __future__ import annotations

import math
from collections.abc import Callable

from pddflow.graph.plan import AutoscalePlan
from pddflow.planner import Meter, Planner, PoolDecision, PoolLoad
from pddflow.planner.capacity import modeled_decode
from pddflow.planner.policy import direction_changes
from pddflow.scheduler import SchedulerState
from pddflow.scheduler.features import UNAVAILABLE
from pddflow.sim.fleet import SimFleet
from pddflow.sim.flight import SimFlight

SAMPLE_PER_INTERVAL = 5  # load samples (and drain checks) per decision


class ElasticPools:
    def __init__(
        self,
        fleet: SimFleet,
        state: SchedulerState,
        autoscale: AutoscalePlan,
        all_arrived: Callable[[], bool],
    ):
        """`all_arrived()`: every request of the workload has arrived (then, once the last
        flight ends, it stops measuring)."""
        self.fleet, self.state, self.autoscale = fleet, state, autoscale
        self.all_arrived = all_arrived
        self.loop, self.plan = fleet.loop, fleet.plan
        plan = fleet.plan
        self.planner = Planner.for_plan(plan)
        self.meter = Meter.for_autoscale(autoscale)
        self.tpot_s = plan.scheduler.tpot_ms / 1e3
        self.pools = {name: list(op.instances) for name, op in plan.operators.items()}
        self.serving: set[str] = {i for ids in self.pools.values() for i in ids}
        self.starting: set[str] = set()
        self.draining: set[str] = set()
        self._alive_since = dict.fromkeys(self.serving, 0.0)
        self._device_s: dict[str, float] = {}  # parked instances' device-seconds so far
        self._devices = {i.id: i.devices for i in plan.instances}
        self._open: set[SimFlight] = set()
        self.decisions: list[PoolDecision] = []
        self._cache_link = fleet.topo.cache_links
        self.timeline: dict[str, list[tuple[float, int]]] = {
            name: [(0.0, len(ids))] for name, ids in self.pools.items()
        }

    # ---- what the simulation tells it ----------------------------------------------------------
    def start(self) -> None:
        self.loop.after(self.autoscale.interval_s / SAMPLE_PER_INTERVAL, self._tick, 1)

    def arrived(self, flight: SimFlight) -> None:
        """Its prefill's work, in the prefill instance's device-model seconds (a long prompt costs
        more than its share of tokens: attention grows with the square)."""
        self._open.add(flight)
        prefill = flight.prefill.instance
        m = self.state.mirror(prefill)
        cached = min(
            (m.match(flight.req.hashes) if m is not None else 0) * self.fleet.block_tokens,
            flight.req.prompt_tokens,
        )
        new = flight.req.prompt_tokens - cached
        work_s = self.fleet.engines[prefill].model.prefill_s(new, cached)
        self.meter.arrived(self.loop.now, self.plan.instance(prefill).operator, work_s)

    def unavailable(self) -> set[str]:
        return {i for ids in self.pools.values() for i in ids} - self.serving

    def mask(self) -> None:
        """The scheduler sees what does not serve as lost: no new work."""
        for iid in self.unavailable():
            self.state.loads[iid] = UNAVAILABLE

    # ---- every sample ----------------------------------------------------------------------------
    def _tick(self, k: int) -> None:
        now = self.loop.now
        self._sample(now)
        self._park_drained(now)
        if k % SAMPLE_PER_INTERVAL == 0:
            for name in self.pools:
                self._decide(now, name)
        if not self._finished():
            self.loop.after(self.autoscale.interval_s / SAMPLE_PER_INTERVAL, self._tick, k + 1)

    def _finished(self) -> bool:
        self._open = {f for f in self._open if not f.done and not f.failed}
        return self.all_arrived() and not self._open

    def _sample(self, now: float) -> None:
        for name, ids in self.pools.items():
            if not self.plan.operators[name].type.decodes:
                continue
            seqs = ctx = 0
            for iid in ids:
                eng = self.fleet.engines[iid]
                seqs += len(eng.running) + len(eng.waiting) + len(self.fleet.stores[iid].waiters)
                ctx += eng.ctx_sum
            self.meter.held(now, name, seqs, ctx)
        for name, link in self.fleet.links.items():
            self.meter.sent(now, name, link.bytes_sent)

    def _load(self, now: float, name: str) -> PoolLoad:
        op = self.plan.operators[name]
        model = self.fleet.engines[self.pools[name][0]].model
        load: dict = {}
        if op.type.prefills:
            queued = 0.0
            for i in self.pools[name]:
                eng = self.fleet.engines[i]
                queued += sum(eng.model.chunk_s(j.tokens - j.sched, j.ctx) for j in eng.jobs)
            load.update(
                prompt_work=self.meter.prompt_rate(now, name),
                prompt_queued=queued,
                prefill_capacity=1.0,
                prompt_unit="prefill s",
            )
        if op.type.decodes:
            seqs, ctx = self.meter.sequences(now, name)
            ctx = ctx or self.plan.model.max_context / 4
            store = self.fleet.stores[self.pools[name][0]]
            kv_seqs = max(1, int(store.capacity * self.fleet.block_tokens // max(ctx, 1)))
            batch = modeled_decode(model, ctx, self.tpot_s, op.max_batch)
            load.update(sequences=seqs, decode_capacity=min(batch, kv_seqs))
        link = self._cache_link.get(name)
        if link is not None:
            gbps = self.fleet.links[link].model.gbps
            load["link_utilization"] = self.meter.link_share(now, link, gbps)
        return PoolLoad(name, **load)

    def _decide(self, now: float, name: str) -> None:
        ids = self.pools[name]
        current = sum(1 for i in ids if i in self.serving or i in self.starting)
        d = self.planner.decide(now, self._load(now, name), current)
        self.decisions.append(d)
        if not d.changes:
            return
        if d.target > current:
            for _ in range(d.target - current):
                self._up(now, name)
        else:
            up = [i for i in ids if i in self.serving or i in self.starting]
            for iid in reversed(up[d.target :]):
                self._down(now, iid)
        self.timeline[name].append((now, d.target))

    # ---- moves -------------------------------------------------------------------------------
    def _up(self, now: float, name: str) -> None:
        ids = self.pools[name]
        back = next((i for i in ids if i in self.draining), None)
        if back is not None:  # a draining instance serves again: it still holds its cache
            self.draining.discard(back)
            self.serving.add(back)
            return
        iid = next(i for i in ids if i not in self.serving | self.starting)
        self.starting.add(iid)
        self._alive_since[iid] = now
        self.fleet.fresh_store(iid)
        self.loop.after(self.autoscale.startup_s, self._started, iid)

    def _started(self, iid: str) -> None:
        if iid in self.starting:
            self.starting.discard(iid)
            self.serving.add(iid)

    def _down(self, now: float, iid: str) -> None:
        if iid in self.starting:  # not serving yet: stop at once
            self.starting.discard(iid)
            self._park(now, iid)
            return
        self.serving.discard(iid)
        self.draining.add(iid)
        self._park_drained(now)

    def _park_drained(self, now: float) -> None:
        if not self.draining:
            return
        held = {i for f in self._open if not f.done and not f.failed for i in f.decision.instances}
        for iid in list(self.draining):
            eng, store = self.fleet.engines[iid], self.fleet.stores[iid]
            if iid in held or eng.running or eng.queued() or store.locked_or_reserved():
                continue
            self.draining.discard(iid)
            self._park(now, iid)

    def _park(self, now: float, iid: str) -> None:
        gone = (now - self._alive_since.pop(iid)) * self._devices[iid]
        self._device_s[iid] = self._device_s.get(iid, 0.0) + gone
        self.fleet.fresh_store(iid)  # its cache goes with it

    # ---- the report --------------------------------------------------------------------------
    def device_seconds(self, until: float) -> dict[str, float]:
        """Each instance's devices x seconds alive (starting, serving or draining) until `until`."""
        out = dict(self._device_s)
        for i, t in self._alive_since.items():
            out[i] = out.get(i, 0.0) + (max(until, t) - t) * self._devices[i]
        return out

    def report(self, until: float) -> dict:
        changes = [d for d in self.decisions if d.changes]
        return {
            "interval_s": self.autoscale.interval_s,
            "bounds": {k: list(v) for k, v in self.plan.pool_bounds().items()},
            "decisions": len(self.decisions),
            "changes": [d.as_json() for d in changes],
            "timeline": {k: [[round(t, 1), n] for t, n in v] for k, v in self.timeline.items()},
            "direction_changes": {
                k: direction_changes([n for _, n in v]) for k, v in self.timeline.items()
            },
            "mean_replicas": {k: round(_mean_count(v, until), 3) for k, v in self.timeline.items()},
        }


def _mean_count(timeline: list[tuple[float, int]], until: float) -> float:
    """The time-weighted mean of a pool's target count over [0, until]."""
    if until <= 0:
        return float(timeline[-1][1])
    area = 0.0
    for (t0, n), (t1, _) in zip(timeline, [*timeline[1:], (until, 0)], strict=False):
        area += n * max(0.0, min(t1, until) - t0)
    return area / until if not math.isclose(until, 0) else 0.0
