"""The simulation of one Plan on one workload: the runtime's scheduler objects, engines, KV stores
and links, and every request's life as events (docs/simulator.md, Request life). This module holds
a flight's arrival, decision, prefill and end; its decode legs and handoff are `DecodeLegs`
(sim/decode_legs.py) and `Handoffs` (sim/handoff.py), on the `SimFleet` (sim/fleet.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from pddflow.graph.plan import AutoscalePlan, Plan
from pddflow.scheduler import (
    InstanceLoad,
    LinkEstimate,
    RequestFeatures,
    SchedulerState,
    make_policy,
)
from pddflow.scheduler.base import Policy
from pddflow.scheduler.prefill_rate import PrefillRate
from pddflow.sim.calibration.terms import Calibration, Draws
from pddflow.sim.decode_legs import DecodeLegs
from pddflow.sim.elastic import ElasticPools
from pddflow.sim.engine import Job, Seq
from pddflow.sim.fleet import SimFleet
from pddflow.sim.flight import LegState, SimFlight
from pddflow.sim.kvstore import Hold
from pddflow.sim.workload import SimRequest, Workload


class Simulation:
    """`embedded`: replay the embedded runtime's worker loop (prefill samples the first token; one
    model call at a time). `wan_jitter_seed`: a deployment's `--seed`, so WAN transfers draw the
    delays its emulated KV link draws, in send order. `stream_gbps`: every link's per-stream rate
    instead of the one the graph declares (0: no cap).

    It is the legs' `FlightEnds` (sim/decode_legs.py): `first_token`, `seq_finished`, `finish`,
    `finish_and_release`, `fail`."""

    def __init__(
        self,
        plan: Plan,
        workload: Workload,
        *,
        seed: int = 0,
        policy: Policy | None = None,
        strict_mirrors: bool = False,
        stream_gbps: float | None = None,
        calibration: Calibration | None = None,
        embedded: bool = False,
        wan_jitter_seed: int | None = None,
        planner: AutoscalePlan | None = None,
    ):
        self.plan, self.workload, self.seed = plan, workload, seed
        self.calibration = cal = calibration or Calibration()
        self.draws = Draws(cal, seed)
        self.embedded = embedded
        self.policy = policy or make_policy(plan)
        self.state = SchedulerState.for_plan(plan)
        # the prefill instances' prefill rates, measured as the runtime's frontend measures them
        self.prefill_rates = {
            i.id: PrefillRate(lambda: self.loop.now)
            for i in plan.instances
            if plan.operators[i.operator].type.prefills
        }
        self.fleet = fleet = SimFleet(
            plan,
            cal,
            self.state.mirrors,
            block_tokens=workload.block_tokens,
            seed=seed,
            embedded=embedded,
            strict_mirrors=strict_mirrors,
            stream_gbps=stream_gbps,
            wan_jitter_seed=wan_jitter_seed,
        )
        # the fleet's parts under the names the reports and the calibration read them by
        self.loop, self.topo, self.host = fleet.loop, fleet.topo, fleet.host
        self.engines, self.stores, self.links = fleet.engines, fleet.stores, fleet.links
        self.block_tokens = fleet.block_tokens
        self.kv_bytes_per_token = fleet.kv_bytes_per_token
        self.legs = DecodeLegs(fleet, self, self.policy, self.state)
        self.flights: list[SimFlight] = []
        self.wall_s = 0.0
        self._next = 0
        self._roots = [r for r in workload.requests if r.parent < 0]
        self._children: dict[int, list[SimRequest]] = {}
        for r in workload.requests:
            if r.parent >= 0:
                self._children.setdefault(r.parent, []).append(r)
        self._arrived = 0
        # `planner`: pools follow the load (sim/elastic.py); None: the plan's fixed replicas
        self.elastic = (
            ElasticPools(fleet, self.state, planner, self._all_arrived)
            if planner is not None
            else None
        )

    def run(self, progress: Callable[[int, int], None] | None = None) -> list[SimFlight]:
        t0 = time.perf_counter()
        self._warm_caches()
        reqs = self.workload.requests
        if self._roots:
            self.loop.at(self._roots[0].arrival_s, self._arrive_root)
            if self.elastic is not None:
                self.elastic.start()
        tick = (lambda _t: progress(self._arrived, len(reqs))) if progress else None
        self.loop.run(tick=tick)
        if progress:
            progress(len(reqs), len(reqs))
        self.wall_s = time.perf_counter() - t0
        self._check_end()
        return self.flights

    def _warm_caches(self) -> None:
        """Place every warm prefix through the policy (placement counts stand in for load, so
        histories spread as live sessions would)."""
        if not self.workload.warm_prefixes:
            return
        decided, singular = self.policy.decided, self.policy.singular_count
        placed: dict[str, int] = {}
        for i, prefix in enumerate(self.workload.warm_prefixes):
            for iid, eng in self.engines.items():
                n = placed.get(iid, 0)
                self.state.loads[iid] = InstanceLoad(n, 0, eng.max_batch, 0.0, n * 8192)
            feats = RequestFeatures(
                f"warm{i}", len(prefix) * self.block_tokens, prefix, 1, self.block_tokens
            )
            dec = self.policy.decide(feats, self.state)
            for _, iid in dec.targets:
                store = self.stores[iid]
                if store.cache is None:
                    continue
                try:
                    hold = store.acquire(prefix, 0)
                except ValueError:
                    continue
                if hold is not None:
                    store.commit(hold, prefix)
                    store.release(hold)
                placed[iid] = placed.get(iid, 0) + 1
        self.policy.decided, self.policy.singular_count = decided, singular
        for store in self.stores.values():
            for tier in (store.host, store.disk):
                if tier is not None:
                    tier.settle()

    def _all_arrived(self) -> bool:
        return self._arrived >= len(self.workload.requests)

    def _check_end(self) -> None:
        stuck = [r for r in self.flights if not r.done and not r.failed]
        if stuck:
            r = stuck[0]
            raise RuntimeError(
                f"{len(stuck)} request(s) never finished (first: #{r.req.rid} variant "
                f"{r.decision.variant}, relay {r.relay.state.value}, main "
                f"{r.main.state.value}); a simulator bug"
            )
        for st in self.stores.values():
            st.check_mirror()
            if st.reserved or st._locked:
                raise RuntimeError(
                    f"{st.name}: {st.reserved} reserved and {st._locked} locked KV blocks leaked"
                )

    def _arrive_root(self) -> None:
        roots = self._roots
        req = roots[self._next]
        self._next += 1
        if self._next < len(roots):
            self.loop.at(roots[self._next].arrival_s, self._arrive_root)
        self._arrive(req)

    def _arrive(self, req: SimRequest) -> None:
        self._arrived += 1
        self._refresh_state()
        # a trace carries no max_tokens: the policy's output-length estimate is all it knows
        feats = RequestFeatures(str(req.rid), req.prompt_tokens, req.hashes, 0, self.block_tokens)
        dec = self.policy.decide(feats, self.state)
        flight = SimFlight(req, dec, self.topo.paths[dec.variant], self.loop.now)
        self.flights.append(flight)
        if self.elastic is not None:
            self.elastic.arrived(flight)
        path = flight.path
        if not path.colocated and path.main != path.relay:
            # main adopts its cached prefix when the job arrives (runtime: _adopt_prefix)
            store = self.stores[flight.main.instance]
            flight.main.hold = store.pin(req.hashes, defer=True)
        self._prefill(flight)

    def _refresh_state(self) -> None:
        for iid in self.engines:
            self.state.loads[iid] = self.fleet.instance_load(iid)
        for name, link in self.links.items():
            est = LinkEstimate.from_model(link.model, link.in_flight)
            self.state.links[name] = replace(est, bytes_per_s=link.new_flow_rate())
        if self.elastic is not None:
            self.elastic.mask()

    def _acquire(
        self, flight: SimFlight, inst: str, extra_tokens: int, then: Callable[[Hold], None]
    ) -> None:
        """Reserve KV on `inst` now or when memory frees (FIFO); fail if it can never fit."""
        store = self.stores[inst]
        extra = -(-extra_tokens // self.block_tokens)
        try:
            hold = store.acquire(flight.req.hashes, extra)
        except ValueError as exc:
            self.fail(flight, str(exc))
            return
        if hold is not None:
            then(hold)
            return

        def retry() -> bool:
            if flight.done or flight.failed:
                return True
            h = store.acquire(flight.req.hashes, extra)
            if h is None:
                return False
            then(h)
            return True

        store.wait(retry)

    def _prefill(self, flight: SimFlight) -> None:
        extra = flight.req.output_tokens if flight.path.colocated else 0
        self._acquire(
            flight, flight.prefill.instance, extra, lambda h: self._prefill_start(flight, h)
        )

    def _prefill_start(self, flight: SimFlight, hold: Hold) -> None:
        leg = flight.prefill
        leg.hold = hold
        cached = min(hold.hit * self.block_tokens, flight.req.prompt_tokens)
        leg.hit_tokens = cached
        new = flight.req.prompt_tokens - cached
        factor = self.draws.prefill_factor()
        per_byte = self.draws.shipping_s_per_byte()
        if per_byte:
            leg.shipping_s = per_byte * self._shipped_bytes(flight)
        job = Job(flight, new, cached, self._prefill_done, factor=factor, after_s=leg.shipping_s)
        if hold.ready_at > self.loop.now:
            # part of the cached prefix is still loading from the host tier
            self.loop.at(hold.ready_at, self.engines[leg.instance].submit_job, job)
            return
        self.engines[leg.instance].submit_job(job)

    def _shipped_bytes(self, flight: SimFlight) -> float:
        path = flight.path
        if path.colocated:
            return 0.0
        out = self.fleet.kv_bytes(flight.req.prompt_tokens, 0) if path.relay is not None else 0.0
        if path.main != path.relay and flight.main.hold is not None:
            out += self.fleet.kv_bytes(flight.req.prompt_tokens, flight.main.hold.hit)
        return out

    def _prefill_done(self, job: Job, t: float) -> None:
        flight = job.flight
        flight.prefill_done_at, flight.prefill_started_at = t, job.started
        leg = flight.prefill
        rate = self.prefill_rates.get(leg.instance)
        if rate is not None and job.started is not None:
            rate.finished(job.tokens, t - job.started)
            self.state.prefill_s_per_token[leg.instance] = rate.s_per_token()
        self.stores[leg.instance].commit(leg.hold, flight.req.hashes)
        path = flight.path
        if path.colocated:
            first = 1 if self.embedded else 0
            if self.embedded:
                flight.first_token_at = t
                if flight.req.output_tokens <= 1:
                    self.finish_and_release(flight, t)
                    return
            self.engines[leg.instance].submit_seq(
                Seq(
                    flight,
                    flight.req.rid,
                    flight.req.prompt_tokens + first,
                    first,
                    flight.req.output_tokens,
                    None if self.embedded else self.first_token,
                    self.seq_finished,
                )
            )
            return
        if path.relay is not None:
            leg.copies += 1
            flight.relay.hold = self.stores[flight.relay.instance].pin(
                flight.req.hashes, defer=True
            )
            self.legs.relay_send(flight)
        if path.main != path.relay:
            leg.copies += 1
            self.legs.send_to_main(flight)

    def first_token(self, seq: Seq, t: float) -> None:
        flight = seq.flight
        if flight.first_token_at is None:
            flight.first_token_at = t

    def seq_finished(self, seq: Seq, t: float) -> None:
        self.finish_and_release(seq.flight, t)

    def finish_and_release(self, flight: SimFlight, t: float) -> None:
        self.finish(flight, t)
        if flight.path.colocated:
            leg = flight.prefill
            if flight.req.done_hashes and leg.hold is not None:
                self.stores[leg.instance].commit_more(leg.hold, flight.req.done_hashes)
            self.stores[leg.instance].release(leg.hold)
            leg.hold = None
        else:
            fin = flight.main
            if flight.req.done_hashes and fin.hold is not None and fin.state is LegState.LANDED:
                self.stores[fin.instance].commit_more(fin.hold, flight.req.done_hashes)
            self.legs.release_main(flight)

    def finish(self, flight: SimFlight, t: float) -> None:
        if flight.done:
            return
        flight.done = True
        flight.finished_at = t
        self.policy.finished(flight.req.prompt_tokens, flight.req.output_tokens)
        if flight.first_token_at is None:
            flight.first_token_at = t
        self._release_children(flight, t)

    def _release_children(self, flight: SimFlight, t: float) -> None:
        for child in self._children.pop(flight.req.rid, ()):
            self.loop.at(t + child.gap_s, self._arrive, child)

    def fail(self, flight: SimFlight, why: str) -> None:
        if flight.failed is None:
            flight.failed = why
            self._release_children(flight, self.loop.now)
        leg = flight.prefill
        if leg.hold is not None:
            self.stores[leg.instance].release(leg.hold)
            leg.hold = None
        self.legs.relay_release(flight)
        self.legs.release_main(flight)
