"""The simulation of one Plan on one workload: the runtime's scheduler objects, engines, KV stores
and links, and every request's life as events (docs/simulator.md, Request life)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace

from pddflow.core.kv_reuse import reused_blocks
from pddflow.core.link import jitter_stream, kv_link_seed
from pddflow.graph.plan import Plan
from pddflow.scheduler import (
    InstanceLoad,
    LinkEstimate,
    RequestFeatures,
    SchedulerState,
    Topology,
    make_policy,
)
from pddflow.scheduler.base import Policy
from pddflow.scheduler.prefill_rate import PrefillRate
from pddflow.sim.calibration.host import HostCpus
from pddflow.sim.calibration.terms import Calibration, Draws
from pddflow.sim.decode_legs import DecodeLegs
from pddflow.sim.engine import Engine, Job, Seq
from pddflow.sim.events import EventLoop
from pddflow.sim.handoff import Handoffs
from pddflow.sim.host_tier import HostTier
from pddflow.sim.kvstore import Hold, KVStore
from pddflow.sim.network import SharedLink
from pddflow.sim.run import LegState, Run
from pddflow.sim.workload import SimRequest, Workload


class Simulation(DecodeLegs, Handoffs):
    """`embedded`: replay the embedded runtime's worker loop (prefill samples the first token; one
    model call at a time). `wan_jitter_seed`: a deployment's `--seed`, so WAN transfers draw the
    delays its emulated KV link draws, in send order. `stream_gbps`: every link's per-stream rate
    instead of the one the graph declares (0: no cap)."""

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
    ):
        self.plan, self.workload, self.seed = plan, workload, seed
        self.calibration = cal = calibration or Calibration()
        self.draws = Draws(cal, seed)
        self.embedded = embedded
        self.loop = EventLoop()
        self.topo = Topology(plan)
        self.policy = policy or make_policy(plan)
        self.state = SchedulerState.for_plan(plan)
        # the entry instances' prefill rates, measured as the runtime's frontend measures them
        self.prefill_rates = {
            i.id: PrefillRate(lambda: self.loop.now)
            for i in plan.instances
            if plan.operators[i.operator].type.entry
        }
        self.block_tokens = workload.block_tokens
        self.kv_bytes_per_token = plan.model.arch.kv_bytes_per_token
        self.page = plan.model.block_size  # KV travels in whole pages, as the runtime's blocks do
        self.links = {
            name: SharedLink(
                self.loop,
                link,
                random.Random(f"{seed}/{name}")
                if wan_jitter_seed is None
                else jitter_stream(kv_link_seed(wan_jitter_seed), 0),
                plan.flow_cap_gbps(name)
                if stream_gbps is None
                else replace(link, stream_gbps=stream_gbps).flow_cap_gbps(plan.streams(name)),
            )
            for name, link in plan.links.items()
        }
        self.host = HostCpus(plan, cal.host) if cal.host is not None else None
        self.engines: dict[str, Engine] = {}
        self.stores: dict[str, KVStore] = {}
        for inst in plan.instances:
            op = plan.operators[inst.operator]
            model = cal.device_model(
                plan.device_classes[inst.device], inst.devices, plan.model.arch
            )
            eng = Engine(self.loop, inst.id, model, op.max_batch, op.chunk_tokens, embedded)
            self.engines[inst.id] = eng
            if self.host is not None:
                self.host.attach(inst.id, eng)
            block_bytes = self.kv_bytes_per_token * self.block_tokens
            cap = int(op.kv_budget_bytes // block_bytes)
            self.stores[inst.id] = KVStore(
                inst.id,
                cap,
                op.caches_prefixes,
                self.state.mirrors.get(inst.id),
                strict_mirrors,
                self._host_tier(op, block_bytes),
            )
        self.runs: list[Run] = []
        self.wall_s = 0.0
        self._next = 0
        self._roots = [r for r in workload.requests if r.parent < 0]
        self._children: dict[int, list[SimRequest]] = {}
        for r in workload.requests:
            if r.parent >= 0:
                self._children.setdefault(r.parent, []).append(r)
        self._arrived = 0

    def _host_tier(self, op, block_bytes: int) -> HostTier | None:
        hc = op.host_cache
        if hc is None or not op.caches_prefixes:
            return None
        blocks = int(hc.bytes // block_bytes)
        if blocks <= 0:
            return None  # declared but none bought (or less than one block)
        return HostTier(blocks, block_bytes / (hc.gbytes_per_s * 1e9), lambda: self.loop.now)

    def run(self, progress: Callable[[int, int], None] | None = None) -> list[Run]:
        t0 = time.perf_counter()
        self._warm_caches()
        reqs = self.workload.requests
        if self._roots:
            self.loop.at(self._roots[0].arrival_s, self._arrive_root)
        tick = (lambda _t: progress(self._arrived, len(reqs))) if progress else None
        self.loop.run(tick=tick)
        if progress:
            progress(len(reqs), len(reqs))
        self.wall_s = time.perf_counter() - t0
        self._check_end()
        return self.runs

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
            if store.host is not None:
                store.host.settle()

    def _check_end(self) -> None:
        stuck = [r for r in self.runs if not r.done and not r.failed]
        if stuck:
            r = stuck[0]
            raise RuntimeError(
                f"{len(stuck)} request(s) never finished (first: #{r.req.rid} variant "
                f"{r.decision.variant}, relay {r.relay.state.value}, finisher "
                f"{r.finisher.state.value}); a simulator bug"
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
        run = Run(req, dec, self.topo.paths[dec.variant], self.loop.now)
        self.runs.append(run)
        path = run.path
        if not path.colocated and path.finisher != path.relay:
            # the finisher adopts its cached prefix when the job arrives (runtime: _adopt_prefix)
            store = self.stores[run.finisher.instance]
            run.finisher.hold = store.pin(req.hashes, defer=True)
        self._prefill(run)

    def _refresh_state(self) -> None:
        for iid in self.engines:
            self.state.loads[iid] = self._instance_load(iid)
        for name, link in self.links.items():
            est = LinkEstimate.from_model(link.model, link.in_flight)
            self.state.links[name] = replace(est, bytes_per_s=link.new_flow_rate())

    def _instance_load(self, iid: str) -> InstanceLoad:
        eng, st = self.engines[iid], self.stores[iid]
        return InstanceLoad(
            len(eng.running),
            eng.queued() + len(st.waiters),
            eng.max_batch,
            st.locked_or_reserved() / max(st.capacity, 1),
            eng.queued_tokens() if eng.jobs else 0,
        )

    def _acquire(
        self, run: Run, inst: str, extra_tokens: int, then: Callable[[Hold], None]
    ) -> None:
        """Reserve KV on `inst` now or when memory frees (FIFO); fail if it can never fit."""
        store = self.stores[inst]
        extra = -(-extra_tokens // self.block_tokens)
        try:
            hold = store.acquire(run.req.hashes, extra)
        except ValueError as exc:
            self._fail(run, str(exc))
            return
        if hold is not None:
            then(hold)
            return

        def retry() -> bool:
            if run.done or run.failed:
                return True
            h = store.acquire(run.req.hashes, extra)
            if h is None:
                return False
            then(h)
            return True

        store.wait(retry)

    def _prefill(self, run: Run) -> None:
        extra = run.req.output_tokens if run.path.colocated else 0
        self._acquire(run, run.prefill.instance, extra, lambda h: self._prefill_start(run, h))

    def _prefill_start(self, run: Run, hold: Hold) -> None:
        leg = run.prefill
        leg.hold = hold
        cached = min(hold.hit * self.block_tokens, run.req.prompt_tokens)
        leg.hit_tokens = cached
        new = run.req.prompt_tokens - cached
        factor = self.draws.prefill_factor()
        per_byte = self.draws.shipping_s_per_byte()
        if per_byte:
            leg.shipping_s = per_byte * self._shipped_bytes(run)
        job = Job(run, new, cached, self._prefill_done, factor=factor, after_s=leg.shipping_s)
        if hold.ready_at > self.loop.now:
            # part of the cached prefix is still loading from the host tier
            self.loop.at(hold.ready_at, self.engines[leg.instance].submit_job, job)
            return
        self.engines[leg.instance].submit_job(job)

    def _shipped_bytes(self, run: Run) -> float:
        path = run.path
        if path.colocated:
            return 0.0
        out = self._kv_bytes(run.req.prompt_tokens, 0) if path.relay is not None else 0.0
        if path.finisher != path.relay and run.finisher.hold is not None:
            out += self._kv_bytes(run.req.prompt_tokens, run.finisher.hold.hit)
        return out

    def _kv_bytes(self, prompt_tokens: int, hit_blocks: int) -> float:
        """As the runtime: whole pages from the first not reused (see `reused_blocks`)."""
        reused = reused_blocks(hit_blocks, prompt_tokens, self.block_tokens) * self.block_tokens
        end = -(-prompt_tokens // self.page) * self.page
        return float(max(end - reused, 0) * self.kv_bytes_per_token)

    def _prefill_done(self, job: Job, t: float) -> None:
        run = job.run
        run.prefill_done_at, run.prefill_started_at = t, job.started
        leg = run.prefill
        rate = self.prefill_rates.get(leg.instance)
        if rate is not None and job.started is not None:
            rate.finished(job.tokens, t - job.started)
            self.state.prefill_s_per_token[leg.instance] = rate.s_per_token()
        self.stores[leg.instance].commit(leg.hold, run.req.hashes)
        path = run.path
        if path.colocated:
            first = 1 if self.embedded else 0
            if self.embedded:
                run.first_token_at = t
                if run.req.output_tokens <= 1:
                    self._finished_at(run, t)
                    return
            self.engines[leg.instance].submit_seq(
                Seq(
                    run,
                    run.req.rid,
                    run.req.prompt_tokens + first,
                    first,
                    run.req.output_tokens,
                    None if self.embedded else self._first,
                    self._finished,
                )
            )
            return
        if path.relay is not None:
            leg.copies += 1
            run.relay.hold = self.stores[run.relay.instance].pin(run.req.hashes, defer=True)
            self._relay_send(run)
        if path.finisher != path.relay:
            leg.copies += 1
            self._finisher_send(run)

    def _copy_left(self, run: Run) -> None:
        leg = run.prefill
        leg.copies -= 1
        if leg.copies == 0 and leg.hold is not None:
            self.stores[leg.instance].release(leg.hold)
            leg.hold = None

    def _first(self, seq: Seq, t: float) -> None:
        run = seq.run
        if run.first_token_at is None:
            run.first_token_at = t

    def _finished(self, seq: Seq, t: float) -> None:
        self._finished_at(seq.run, t)

    def _finished_at(self, run: Run, t: float) -> None:
        self._finish(run, t)
        if run.path.colocated:
            leg = run.prefill
            if run.req.done_hashes and leg.hold is not None:
                self.stores[leg.instance].commit_more(leg.hold, run.req.done_hashes)
            self.stores[leg.instance].release(leg.hold)
            leg.hold = None
        else:
            fin = run.finisher
            if run.req.done_hashes and fin.hold is not None and fin.state is LegState.LANDED:
                self.stores[fin.instance].commit_more(fin.hold, run.req.done_hashes)
            self._finisher_release(run)

    def _finish(self, run: Run, t: float) -> None:
        if run.done:
            return
        run.done = True
        run.finished_at = t
        self.policy.finished(run.req.prompt_tokens, run.req.output_tokens)
        if run.first_token_at is None:
            run.first_token_at = t
        self._release_children(run, t)

    def _release_children(self, run: Run, t: float) -> None:
        for child in self._children.pop(run.req.rid, ()):
            self.loop.at(t + child.gap_s, self._arrive, child)

    def _fail(self, run: Run, why: str) -> None:
        if run.failed is None:
            run.failed = why
            self._release_children(run, self.loop.now)
        leg = run.prefill
        if leg.hold is not None:
            self.stores[leg.instance].release(leg.hold)
            leg.hold = None
        self._relay_release(run)
        self._finisher_release(run)
