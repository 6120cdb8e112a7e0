"""The simulation of one Plan on one workload: the same scheduler objects as the runtime, engines,
KV stores and links from the plan, and every request's life as events.

A request's life (matching docs/structure.md):
1. arrival: the policy decides (variant, instances, handoff mode, singular) from the mirrors,
   loads and link estimates, exactly as the runtime's router does;
2. the entry instance locks its cached prefix, reserves the rest, prefills the uncached tokens
   (colocated: then decodes them itself);
3. the KV goes to the relay over RDMA (whole prompt) and to the finishing decoder (only the blocks
   its cache lacks, over the WAN or RDMA), both at once. As in the runtime, the finisher pins its
   cached prefix when the request arrives, and a decoder reserves memory for the rest of the prompt
   and the whole output only when the KV lands (at a step boundary, first come first served);
   until then the KV waits;
4. the relay decodes as soon as its copy lands (eager tokens); when the finisher's copy lands the
   relay hands over token IDs, one-shot or in catch-up rounds, and the finisher extends over them
   and decodes to the end. If the finisher's copy lands before the relay has started, the finisher
   simply takes the request over;
5. singular traffic: the relay finishes the request and the WAN leg is cancelled;
6. finishing releases every hold; cached blocks stay, evictable.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from pddflow.core.cpu_layout import plan_layout
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
from pddflow.scheduler.decision import Decision
from pddflow.scheduler.topology import PathInfo
from pddflow.sim.device import DeviceModel, Efficiency
from pddflow.sim.engine import Engine, Job, Seq
from pddflow.sim.events import EventLoop
from pddflow.sim.kvstore import Hold, KVStore
from pddflow.sim.network import IDS_BYTES_PER_TOKEN, RDMA_LATENCY_S, STREAM_GBPS, Flow, SharedLink
from pddflow.sim.workload import SimRequest, Workload

# a prefill that waited this long for its engine ran in a busy period (calibrate.py too)
QUEUED_S = 0.05


class Run:
    """One request in flight and what happened to it."""

    __slots__ = (
        "req",
        "dec",
        "path",
        "arrival",
        "t_prefill",
        "t_prefill_start",
        "t_first",
        "t_finish",
        "done",
        "failed",
        "p_inst",
        "p_hold",
        "p_legs",
        "r_inst",
        "r_hold",
        "r_seq",
        "r_state",
        "m_inst",
        "m_hold",
        "m_flow",
        "m_state",
        "m_bytes",
        "m_hit",
        "ids_sent",
        "relay_tokens",
        "handoff",
        "rounds",
        "p_hit_tokens",
        "m_sent_at",
        "m_transfer_s",
        "memory_waits",
        "memory_wait_s",
        "p_ship_s",
        "r_landed_at",
        "r_started_at",
    )

    def __init__(self, req: SimRequest, dec: Decision, path: PathInfo):
        self.req, self.dec, self.path = req, dec, path
        self.arrival = req.arrival_s
        self.t_prefill = self.t_prefill_start = self.t_first = self.t_finish = None
        self.done = False
        self.failed: str | None = None
        self.p_inst = dec.target(path.entry)
        self.p_hold: Hold | None = None
        self.p_legs = 0
        self.r_inst = dec.target(path.relay) if path.relay else None
        self.r_hold: Hold | None = None
        self.r_seq: Seq | None = None
        self.r_state = "none"  # none | transfer | memory (landed, waits for room) | decoding | released | cancelled
        # the KV reached the relay; the relay's loop took it
        self.r_landed_at = self.r_started_at = None
        self.m_inst = dec.target(path.finisher)
        self.m_hold: Hold | None = None
        self.m_flow: Flow | None = None
        self.m_state = "none"  # none | transfer | memory (landed, waits for room) | landed | released | cancelled
        self.m_bytes = 0.0
        self.m_hit = 0
        self.ids_sent = 0
        self.relay_tokens = 0
        self.handoff: str | None = None  # one_shot | catch_up | takeover, once it happened
        self.rounds = 0
        self.p_hit_tokens = 0
        self.m_sent_at = 0.0
        self.m_transfer_s: float | None = None
        self.memory_waits = 0  # legs whose landed KV waited for decoder memory, and how long
        self.memory_wait_s = 0.0
        self.p_ship_s = 0.0  # the prefill engine's time shipping this prompt's KV (drawn)


CFS_NICE_STEP = 1.25  # Linux CFS: one nice level is about 1.25x less CPU weight


class CpuShare:
    """Every instance on one host's CPU cores (the embedded deployment: one process per instance).

    Each worker runs `threads` threads; the calibration benchmark ran `bench_threads`. A busy
    worker's step takes `thread_penalty` times the calibrated step (fewer threads than the
    benchmark: (bench_threads / threads) ** thread_exponent) and, when more workers are busy than
    the cores hold (busy x threads > cores), the cores are shared equally: a further factor of
    busy x threads / cores. Workers with a lower priority (`nice`, as the runtime sets for a decoder
    sharing cores with prefill) weigh less, as under Linux's CFS (1.25x less per nice level): a
    busy worker gets the cores in proportion to its weight, at most its threads' worth. The factor
    is taken when an engine plans its steps; every idle/busy transition cuts the other busy
    engines' multi-step plans at their next boundary, so they re-plan at the new share.

    `background`: runnable threads of other tenants, assumed the same while the benchmark ran and
    now; the calibrated step already paid the benchmark's share (bench_threads + background over
    the cores), so the factor is the ratio of the two shares.

    `host` (HostCpus) adds what other core groups cost this one: while a worker on other cores is
    busy, a prefill/extend step takes `host.corun_prefill` times longer and a decode step
    `host.corun_decode` (shared cache and memory bus; measured by `bench engine`'s co-run point).

    `serving`: runnable threads' worth of the serving path (the frontend process and the benchmark
    client, unpinned) on these cores while the workload runs. Unlike `background` the calibration
    benchmark did not see it, so it only adds to the demand."""

    def __init__(
        self,
        cores: float,
        threads: int = 1,
        bench_threads: int = 1,
        thread_exponent: float = 1.0,
        background: float = 0.0,
        host: HostCpus | None = None,
        serving: float = 0.0,
    ):
        self.cores, self.threads = max(cores, 1e-9), max(1, threads)
        self.background = max(0.0, background)
        self.serving = max(0.0, serving)
        self.bench_share = max(1.0, (max(1, bench_threads) + self.background) / self.cores)
        self.penalty = (
            (max(1, bench_threads) / self.threads) ** thread_exponent
            if bench_threads > self.threads
            else 1.0
        )
        self.engines: list[Engine] = []
        self.nice: dict[str, int] = {}
        self.weight: dict[str, float] = {}
        self.busy = 0
        self.host = host

    def attach(self, eng: Engine, nice: int = 0) -> None:
        self.engines.append(eng)
        self.nice[eng.name], self.weight[eng.name] = nice, CFS_NICE_STEP**-nice
        eng.slowdown = lambda prefill=False, e=eng: self.factor(e, prefill)
        eng.on_busy = self._changed

    def factor(self, eng: Engine | None = None, prefill: bool = False) -> float:
        mine = (self.weight[eng.name] if eng is not None else 1.0) * self.threads
        demand = (
            sum(self.weight[e.name] for e in self.engines if e._busy) * self.threads
            + self.background
            + self.serving
        )
        given = min(self.threads, self.cores * mine / max(demand, mine))  # cores this engine gets
        f = self.penalty * (self.threads / given) / self.bench_share
        if self.host is not None and self.host.others_busy(self):
            f *= self.host.corun_prefill if prefill else self.host.corun_decode
        return f

    def _changed(self, eng: Engine) -> None:
        busy = sum(1 for e in self.engines if e._busy)
        if busy == self.busy:
            return
        was, self.busy = self.busy, busy
        for e in self.engines:
            if e is not eng:
                e.replan()
        if self.host is not None and (was == 0) != (busy == 0):
            self.host.group_changed(self)

    def to_dict(self) -> dict:
        return {
            "cores": self.cores,
            "threads_per_worker": self.threads,
            "thread_penalty": round(self.penalty, 4),
            "background_threads": self.background,
            "serving_threads": round(self.serving, 4),
            "instances": [e.name for e in self.engines],
            "nice": dict(self.nice),
        }


class HostCpus:
    """The embedded deployment's host, laid out as the runtime lays it out (core/cpu_layout.py):
    workers pinned to the same cores share them (one CpuShare per such group), groups never slow
    each other. `background` (other tenants, present during the calibration too) and `serving` (the
    frontend and the client: cores' worth of CPU they take while the workload runs) are unpinned,
    spread over the groups in proportion to their cores."""

    def __init__(
        self,
        plan: Plan,
        cores: float,
        bench_threads: int = 1,
        background: float = 0.0,
        pinning: str = "auto",
        thread_exponent: float = 1.0,
        corun: tuple[float, float] = (1.0, 1.0),
        serving: float = 0.0,
    ):
        lay = plan_layout(plan, list(range(max(1, int(cores)))), pinning)
        self.mode, self.nice = lay.mode, lay.nice
        # (prefill, decode) step slowdown while another core group is busy: 1 = cores never slow
        # each other (`bench engine`'s co-run point measures it)
        self.corun_prefill, self.corun_decode = (max(1.0, float(x)) for x in corun)
        groups: dict[tuple[int, ...], CpuShare] = {}
        self.share: dict[str, CpuShare] = {}
        for inst in plan.instances:
            key = lay.cpus[inst.id]
            if key not in groups:
                n = float(len(key)) if key else cores
                groups[key] = CpuShare(
                    n,
                    lay.threads[inst.id],
                    bench_threads,
                    thread_exponent,
                    background=background * n / max(cores, 1e-9),
                    host=self,
                    serving=serving * n / max(cores, 1e-9),
                )
            self.share[inst.id] = groups[key]
        self.groups = list(groups.values())

    def attach(self, instance: str, eng: Engine) -> None:
        self.share[instance].attach(eng, self.nice[instance])

    def others_busy(self, group: CpuShare) -> bool:
        return any(g.busy for g in self.groups if g is not group)

    def group_changed(self, group: CpuShare) -> None:
        """A group went idle or busy: the other groups' workers re-plan at their new co-run factor."""
        if self.corun_prefill == 1.0 and self.corun_decode == 1.0:
            return
        for g in self.groups:
            if g is not group:
                for e in g.engines:
                    e.replan()

    def to_dict(self) -> dict:
        return {
            "layout": self.mode,
            "corun": {"prefill": self.corun_prefill, "decode": self.corun_decode},
            "serving_cores": round(sum(g.serving for g in self.groups), 4),
            "groups": [g.to_dict() for g in self.groups],
        }


class Simulation:
    def __init__(
        self,
        plan: Plan,
        workload: Workload,
        *,
        seed: int = 0,
        efficiency: Efficiency | None = None,
        device_efficiency: dict[str, Efficiency] | None = None,
        policy: Policy | None = None,
        strict_mirrors: bool = False,
        stream_gbps: float = STREAM_GBPS,
        cpu: HostCpus | None = None,
        prefill_first_token: bool = False,
        wan_jitter_seed: int | None = None,
        prefill_spread: tuple[float, ...] = (),
        relay_handovers: tuple[float, ...] = (),
        exclusive_jobs: bool = False,
        prefill_shipping: tuple[float, ...] = (),
        decode_wall_factors: dict[str, float] | None = None,
        relay_handovers_queued: tuple[float, ...] = (),
        prefill_wall_factors: dict[str, float] | None = None,
        serving_latency_s: float = 0.0,
        prefill_size_trend: tuple[float, float] = (0.0, 1.0),
    ):
        self.plan, self.workload, self.seed = plan, workload, seed
        # Each prefill costs the model's time x a factor drawn from `prefill_spread` (median 1: a
        # deployment calibration's measured prefills over the model). A deployment's prefills
        # spread 0.8-1.7x around their median; queues in a closed loop grow from the long ones.
        self.prefill_spread = tuple(prefill_spread)
        # ... and (n / ref) ** exponent for n new tokens: the calibration's size trend (longer
        # prompts measured cheaper than the model extrapolates)
        self.prefill_size_trend = prefill_size_trend
        self._spread_rng = random.Random(f"{seed}/prefill-spread")
        # Seconds from a prefill's end to its KV on a same-host relay, drawn from a deployment's
        # measured ones (export, the rdma_tensor copy, both sides' threads on busy cores); empty:
        # the RDMA model (microseconds)
        self.relay_handovers = tuple(relay_handovers)
        # ... of which those measured after prefills that had queued: a queued prefill draws from
        # them, the others from the rest (a busy host copies slower)
        queued = tuple(sorted(relay_handovers_queued))
        rest = tuple(sorted((Counter(self.relay_handovers) - Counter(queued)).elements()))
        self._handovers_by_load = (rest, queued) if queued and rest else (self.relay_handovers,) * 2
        self._handover_rng = random.Random(f"{seed}/relay-handover")
        # Seconds from a client sending a request to the deployment taking it, plus the first
        # token's way back (a deployment calibration's measured serving path, a few ms): the
        # request enters that long after it was sent, and its TTFT and end count from the send
        self.serving_latency_s = max(0.0, serving_latency_s)
        self.cpu = cpu
        # True: as the runtime does, prefill samples the first token and the client sees it as soon as
        # a decoder holds the KV (relay landed, or main landed on a takeover / P->MD path, or the
        # prefill itself when colocated); decoders then start at token 2. False: the first token is
        # the first decode step's (the model the cluster-scale results in docs/simulator.md used).
        self.pft = prefill_first_token
        # True: every engine runs as the runtime's worker loop does, one model call at a time (a
        # prefill or extend whole and alone, decoders waiting); False: chunked prefill mixed into
        # the decode batch, as production engines run (sim/engine.py)
        self.exclusive_jobs = exclusive_jobs
        # Seconds per byte of KV a prefill engine stays busy after each prefill, drawn from a
        # deployment's measured ones (its worker exports every KV copy in its loop before the next
        # prefill: 0.1-6 ms per MB on this busy host); only with `exclusive_jobs`
        self.prefill_shipping = tuple(prefill_shipping)
        self._shipping_rng = random.Random(f"{seed}/prefill-shipping")
        self.loop = EventLoop()
        self.topo = Topology(plan)
        self.policy = policy or make_policy(plan)
        self.state = SchedulerState.for_plan(plan)
        self.bt = workload.block_tokens
        self.kvb = plan.model.arch.kv_bytes_per_token
        self.page = plan.model.block_size  # KV travels in whole pages, as the runtime's blocks do
        eff = efficiency or Efficiency()
        per_dev = device_efficiency or {}
        # Replaying a deployment (`wan_jitter_seed`: its `--seed`): every WAN transfer draws its delay
        # from the sequence the deployment's emulated KV link draws from, in send order (its
        # one-batch transfers all take stream 0's), so both see the same few dozen delays.
        self.links = {
            name: SharedLink(
                self.loop,
                link,
                random.Random(f"{seed}/{name}")
                if wan_jitter_seed is None
                else jitter_stream(kv_link_seed(wan_jitter_seed), 0),
                self._streams(name) * stream_gbps,
            )
            for name, link in plan.links.items()
        }
        self.engines: dict[str, Engine] = {}
        self.stores: dict[str, KVStore] = {}
        for inst in plan.instances:
            op = plan.operators[inst.operator]
            model = DeviceModel(
                plan.device_classes[inst.device],
                inst.devices,
                plan.model.arch,
                per_dev.get(inst.device, eff),
            )
            self.engines[inst.id] = Engine(
                self.loop,
                inst.id,
                model,
                op.max_batch,
                op.chunk_tokens,
                exclusive_jobs,
            )
            if cpu is not None:
                cpu.attach(inst.id, self.engines[inst.id])
            # a deployment calibration's decode and prefill wall beyond the host model (serve_replay.wall_factors)
            self.engines[inst.id].decode_wall_factor = (decode_wall_factors or {}).get(inst.id, 1.0)
            self.engines[inst.id].prefill_wall_factor = (prefill_wall_factors or {}).get(
                inst.id, 1.0
            )
            cap = int(op.kv_budget_bytes // (self.kvb * self.bt))
            self.stores[inst.id] = KVStore(
                inst.id, cap, op.caches_prefixes, self.state.mirrors.get(inst.id), strict_mirrors
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

    def _streams(self, link: str) -> int:
        """Parallel streams a KV transfer over `link` uses (the most any KV channel across it declares)."""
        return max(
            (
                int(c.params.get("streams", 1))
                for c in self.plan.channels
                if c.link == link and c.kind == "wan_flight"
            ),
            default=1,
        )

    # ---- driving --------------------------------------------------------------------------------
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
        """Route every warm prefix through the policy and insert it into the chosen instances' caches
        (through the stores, so mirrors see the inserts). Placement counts stand in for load so the
        histories spread the way live sessions would."""
        if not self.workload.warm_prefixes:
            return
        decided, singular = self.policy.decided, self.policy.singular_count
        placed: dict[str, int] = {}
        for i, prefix in enumerate(self.workload.warm_prefixes):
            for iid, eng in self.engines.items():
                n = placed.get(iid, 0)
                self.state.loads[iid] = InstanceLoad(n, 0, eng.max_batch, 0.0, n * 8192)
            feats = RequestFeatures(f"warm{i}", len(prefix) * self.bt, prefix, 1, self.bt)
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

    def _check_end(self) -> None:
        stuck = [r for r in self.runs if not r.done and not r.failed]
        if stuck:
            r = stuck[0]
            raise RuntimeError(
                f"{len(stuck)} request(s) never finished (first: #{r.req.rid} variant {r.dec.variant}, "
                f"relay {r.r_state}, main {r.m_state}); a simulator bug"
            )
        for st in self.stores.values():
            st.check_mirror()
            if st.reserved or st._locked:
                raise RuntimeError(
                    f"{st.name}: {st.reserved} reserved and {st._locked} locked KV blocks leaked"
                )

    # ---- 1. arrival and decision ------------------------------------------------------------------
    def _arrive_root(self) -> None:
        roots = self._roots
        req = roots[self._next]
        self._next += 1
        if self._next < len(roots):
            self.loop.at(roots[self._next].arrival_s, self._arrive_root)
        self._arrive(req)

    def _arrive(self, req: SimRequest) -> None:
        if self.serving_latency_s > 0:
            self.loop.after(self.serving_latency_s, self._enter, req, self.loop.now)
        else:
            self._enter(req, self.loop.now)

    def _enter(self, req: SimRequest, sent: float) -> None:
        self._arrived += 1
        self._refresh_state()
        feats = RequestFeatures(
            str(req.rid), req.prompt_tokens, req.hashes, req.output_tokens, self.bt
        )
        dec = self.policy.decide(feats, self.state)
        run = Run(req, dec, self.topo.paths[dec.variant])
        run.arrival = sent
        self.runs.append(run)
        path = run.path
        if not path.colocated and path.finisher != path.relay:
            # the finisher adopts its cached prefix when the job arrives (runtime: _adopt_prefix)
            run.m_hold = self.stores[run.m_inst].pin(req.hashes)
        self._prefill(run)

    def _refresh_state(self) -> None:
        loads = self.state.loads
        for iid, eng in self.engines.items():
            st = self.stores[iid]
            loads[iid] = InstanceLoad(
                len(eng.running),
                eng.queued() + len(st.waiters),
                eng.max_batch,
                st.locked_or_reserved() / max(st.capacity, 1),
                eng.queued_tokens() if eng.jobs else 0,
            )
        for name, link in self.links.items():
            est = LinkEstimate.from_model(link.model, link.in_flight)
            self.state.links[name] = replace(est, bytes_per_s=link.new_flow_rate())

    # ---- 2. prefill -----------------------------------------------------------------------------
    def _acquire(
        self, run: Run, inst: str, extra_tokens: int, then: Callable[[Hold], None]
    ) -> None:
        """Reserve KV on `inst` now or as soon as memory frees (FIFO); fail the request if it can
        never fit. A request that ended while waiting is dropped."""
        store = self.stores[inst]
        extra = -(-extra_tokens // self.bt)
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
        self._acquire(run, run.p_inst, extra, lambda h: self._prefill_start(run, h))

    def _prefill_start(self, run: Run, hold: Hold) -> None:
        run.p_hold = hold
        cached = min(hold.hit * self.bt, run.req.prompt_tokens)
        run.p_hit_tokens = cached
        factor = self._spread_rng.choice(self.prefill_spread) if self.prefill_spread else 1.0
        exponent, ref = self.prefill_size_trend
        if exponent:
            factor *= (max(1, run.req.prompt_tokens - cached) / ref) ** exponent
        if self.prefill_shipping:
            run.p_ship_s = self._shipping_rng.choice(self.prefill_shipping) * self._shipped_bytes(
                run
            )
        self.engines[run.p_inst].submit_job(
            Job(
                run,
                run.req.prompt_tokens - cached,
                cached,
                self._prefill_done,
                factor=factor,
                after_s=run.p_ship_s,
            )
        )

    def _shipped_bytes(self, run: Run) -> float:
        """The KV bytes a prefill sends: the whole prompt to the relay, the missing blocks to the finisher."""
        path = run.path
        if path.colocated:
            return 0.0
        out = self._kv_bytes(run.req.prompt_tokens, 0) if path.relay is not None else 0.0
        if path.finisher != path.relay and run.m_hold is not None:
            out += self._kv_bytes(run.req.prompt_tokens, run.m_hold.hit)
        return out

    def _prefill_done(self, job: Job, t: float) -> None:
        run = job.run
        run.t_prefill, run.t_prefill_start = t, job.started
        store = self.stores[run.p_inst]
        store.commit(run.p_hold, run.req.hashes)
        path = run.path
        if path.colocated:
            if self.pft:
                run.t_first = t
                if run.req.output_tokens <= 1:
                    self._finished_at(run, t)
                    return
                self.engines[run.p_inst].submit_seq(
                    Seq(
                        run,
                        run.req.rid,
                        run.req.prompt_tokens + 1,
                        1,
                        run.req.output_tokens,
                        None,
                        self._finished,
                    )
                )
                return
            self.engines[run.p_inst].submit_seq(
                Seq(
                    run,
                    run.req.rid,
                    run.req.prompt_tokens,
                    0,
                    run.req.output_tokens,
                    self._first,
                    self._finished,
                )
            )
            return
        if path.relay is not None:
            run.p_legs += 1
            run.r_hold = self.stores[run.r_inst].pin(run.req.hashes)
            self._relay_send(run)
        if path.finisher != path.relay:
            run.p_legs += 1
            self._main_send(run)

    def _leg_done(self, run: Run) -> None:
        """One outgoing copy of the prompt KV has left the entry instance."""
        run.p_legs -= 1
        if run.p_legs == 0 and run.p_hold is not None:
            self.stores[run.p_inst].release(run.p_hold)
            run.p_hold = None

    def _land(
        self,
        run: Run,
        inst: str,
        hold: Hold,
        waiting: Callable[[], bool],
        then: Callable[[], None],
        drop: Callable[[], None],
    ) -> None:
        """Landed KV on a decoder: reserve the rest of the prompt and the whole output on `inst`,
        now or, behind KV that landed earlier, as soon as memory frees (runtime/worker.py:
        `_room_for`). `waiting()` says the leg still wants the memory; if not, `drop()` it."""
        store = self.stores[inst]
        extra = -(-run.req.output_tokens // self.bt)
        landed = self.loop.now

        def attempt() -> bool:
            if not waiting():
                drop()
                return True
            try:
                if not store.reserve(hold, extra):
                    return False
            except ValueError as exc:
                self._fail(run, str(exc))
                return True
            run.memory_wait_s += self.loop.now - landed
            then()
            return True

        if store.waiters or not attempt():
            run.memory_waits += 1
            store.wait(attempt)

    # ---- 3a. the relay's copy -----------------------------------------------------------------------
    def _relay_send(self, run: Run) -> None:
        run.r_state = "transfer"
        nbytes = self._kv_bytes(run.req.prompt_tokens, 0)
        dt = RDMA_LATENCY_S + nbytes / self.topo.rdma_bytes_per_s(run.path.entry, run.path.relay)
        if self.relay_handovers:
            busy = run.t_prefill_start is not None and run.t_prefill_start - run.arrival >= QUEUED_S
            dt = self._handover_rng.choice(self._handovers_by_load[busy])
        self.loop.after(dt, self._relay_landed, run)

    def _relay_landed(self, run: Run) -> None:
        self._leg_done(run)
        run.r_landed_at = self.loop.now
        # A worker takes landed KV in between its steps (runtime/worker.py: admit, then one step),
        # so a busy decoder starts on it, and shows its first token, at its next step boundary.
        self.engines[run.r_inst].submit_control(lambda _now: self._relay_import(run))

    def _relay_import(self, run: Run) -> None:
        if run.r_state != "transfer" or run.done or run.r_hold is None:
            self._relay_release(run)
            return
        run.r_state = "memory"
        self._land(
            run,
            run.r_inst,
            run.r_hold,
            lambda: run.r_state == "memory" and not run.done,
            lambda: self._relay_start(run),
            lambda: self._relay_release(run),
        )

    def _relay_start(self, run: Run) -> None:
        self.stores[run.r_inst].commit(run.r_hold, run.req.hashes)
        run.r_state = "decoding"
        run.r_started_at = self.loop.now
        if self.pft and run.req.output_tokens > 1:
            if run.t_first is None:
                run.t_first = self.loop.now  # the relay emits prefill's first token on landing
            run.r_seq = Seq(
                run,
                run.req.rid,
                run.req.prompt_tokens + 1,
                1,
                run.req.output_tokens,
                None,
                self._relay_finished,
            )
        else:
            run.r_seq = Seq(
                run,
                run.req.rid,
                run.req.prompt_tokens,
                0,
                run.req.output_tokens,
                self._first,
                self._relay_finished,
            )
        self.engines[run.r_inst].submit_seq(run.r_seq)

    def _relay_release(self, run: Run) -> None:
        if run.r_hold is not None:
            self.stores[run.r_inst].release(run.r_hold)
            run.r_hold = None
        if run.r_state in ("memory", "transfer", "decoding"):
            run.r_state = "cancelled" if run.r_state != "decoding" else "released"

    def _relay_finished(self, seq: Seq, t: float) -> None:
        """The relay emitted the last token: singular traffic, or an output shorter than the transfer."""
        run = seq.run
        run.relay_tokens = run.req.output_tokens
        self._relay_release(run)
        self._finish(run, t)
        if run.dec.singular and run.m_state in ("memory", "transfer"):
            if run.m_flow is not None:
                sent = self.links[run.path.wan_link].cancel(run.m_flow)
                run.m_bytes = sent
                self._leg_done(run)
            elif run.m_state == "transfer":
                return  # an RDMA leg: it lands on its own
            run.m_state = "cancelled"
            self._main_release(run)

    # ---- 3b. the finisher's copy ----------------------------------------------------------------------
    def _main_send(self, run: Run) -> None:
        run.m_state = "transfer"
        run.m_hit = run.m_hold.hit
        nbytes = self._kv_bytes(run.req.prompt_tokens, run.m_hit)
        run.m_bytes = nbytes
        run.m_sent_at = self.loop.now
        link = run.path.wan_link
        if link is not None:
            run.m_flow = self.links[link].send(nbytes, lambda t: self._main_landed(run))
        else:
            dt = RDMA_LATENCY_S + nbytes / self.topo.rdma_bytes_per_s(
                run.path.entry, run.path.finisher
            )
            self.loop.after(dt, self._main_landed, run)

    def _kv_bytes(self, prompt_tokens: int, hit_blocks: int) -> float:
        """What prefill sends for a prompt whose first `hit_blocks` blocks the target has: as the
        runtime, whole pages from the first one not reused, and
        the block holding the prompt's last token always travels."""
        reused = reused_blocks(hit_blocks, prompt_tokens, self.bt) * self.bt
        end = -(-prompt_tokens // self.page) * self.page
        return float(max(end - reused, 0) * self.kvb)

    def _main_landed(self, run: Run) -> None:
        self._leg_done(run)
        run.m_flow = None
        if run.m_state != "transfer":
            return
        run.m_transfer_s = self.loop.now - run.m_sent_at
        self.engines[run.m_inst].submit_control(
            lambda _now: self._main_import(run)
        )  # as _relay_landed

    def _main_import(self, run: Run) -> None:
        if run.m_state != "transfer" or run.m_hold is None:
            return
        run.m_state = "memory"
        self._land(
            run,
            run.m_inst,
            run.m_hold,
            lambda: run.m_state == "memory",
            lambda: self._main_start(run),
            lambda: self._main_release(run),
        )

    def _main_start(self, run: Run) -> None:
        run.m_state = "landed"
        self.stores[run.m_inst].commit(run.m_hold, run.req.hashes)
        if run.done and run.path.has_handoff and not run.dec.singular and run.req.done_hashes:
            # The relay finished first. As in the runtime it still sent main every token ID, and main
            # extends over them so its cache keeps this turn (prompt + output) for the next one.
            self.engines[run.m_inst].submit_job(
                Job(
                    run,
                    run.req.output_tokens,
                    run.req.prompt_tokens,
                    self._cache_only_extended,
                    "extend",
                )
            )
            return
        if run.done or (run.dec.singular and run.path.has_handoff):
            self._main_release(run)  # the relay finished (or will): MD only keeps the blocks cached
            return
        if run.path.has_handoff and run.r_state == "decoding":
            self.engines[run.r_inst].submit_control(lambda now: self._handoff(run, now))
            return
        if run.path.has_handoff:  # the relay never started: main decode takes the request over
            run.handoff = "takeover"
            self._relay_release(run)
        self._main_decode(run, 0, None)

    def _cache_only_extended(self, job: Job, t: float) -> None:
        run = job.run
        if run.m_hold is not None and run.m_state == "landed":
            self.stores[run.m_inst].commit_more(run.m_hold, run.req.done_hashes)
        self._main_release(run)

    def _main_decode(self, run: Run, tokens0: int, t_emitted: float | None) -> None:
        out = run.req.output_tokens
        if t_emitted is not None and tokens0 >= out:
            self._finished_at(run, t_emitted)
            return
        if self.pft and tokens0 == 0 and out > 1:
            if run.t_first is None:
                run.t_first = self.loop.now  # main emits prefill's first token on landing
            tokens0 = 1
        seq = Seq(
            run,
            run.req.rid,
            run.req.prompt_tokens + tokens0,
            tokens0,
            out,
            self._first if tokens0 == 0 else None,
            self._finished,
        )
        self.engines[run.m_inst].submit_seq(seq)

    def _main_release(self, run: Run) -> None:
        if run.m_hold is not None:
            self.stores[run.m_inst].release(run.m_hold)
            run.m_hold = None
        if run.m_state in ("landed", "transfer", "memory"):
            run.m_state = "released" if run.m_state == "landed" else "cancelled"

    # ---- 4. handoff ---------------------------------------------------------------------------------
    def _handoff(self, run: Run, now: float) -> None:
        """At a relay step boundary: hand the generated token IDs to main decode (all, or one round)."""
        if run.done:
            self._main_release(run)
            return
        relay = self.engines[run.r_inst]
        seq = run.r_seq
        if not relay.is_running(seq):  # still queued for a batch slot: main decode takes over
            relay.remove(seq)
            run.handoff = "takeover"
            self._relay_release(run)
            self._main_decode(run, 0, None)
            return
        n = relay.generated(seq)
        new = n - run.ids_sent
        final = run.dec.handoff != "catch_up" or new <= run.path.variant.catch_up_tokens
        ctx = run.req.prompt_tokens + run.ids_sent
        if final:
            relay.remove(seq)
            run.relay_tokens = n
            run.handoff = run.dec.handoff or "one_shot"
            self._relay_release(run)
        run.ids_sent = n
        run.rounds += 1
        done = self._extended_final if final else self._extended_round
        self._ids(
            run,
            new,
            lambda t: self.engines[run.m_inst].submit_job(Job(run, new, ctx, done, "extend")),
        )

    def _ids(self, run: Run, ntokens: int, then: Callable[[float], None]) -> None:
        ch = run.path.handoff
        nbytes = max(ntokens, 1) * IDS_BYTES_PER_TOKEN
        if ch is not None and ch.link is not None:
            self.links[ch.link].message(nbytes, then)
        else:
            self.loop.after(RDMA_LATENCY_S, lambda: then(self.loop.now))

    def _extended_round(self, job: Job, t: float) -> None:
        run = job.run
        if run.done:
            self._main_release(run)
            return
        # main decode acks; the relay checks at its next boundary how far ahead it has run
        self._ids(
            run,
            1,
            lambda _t: self.engines[run.r_inst].submit_control(lambda now: self._handoff(run, now)),
        )

    def _extended_final(self, job: Job, t: float) -> None:
        """The extend over the last handed-off IDs also yields the next token."""
        run = job.run
        self._main_decode(run, run.relay_tokens + 1, t)

    # ---- 5. the end ---------------------------------------------------------------------------------
    def _first(self, seq: Seq, t: float) -> None:
        run = seq.run
        if run.t_first is None:
            run.t_first = t

    def _finished(self, seq: Seq, t: float) -> None:
        self._finished_at(seq.run, t)

    def _finished_at(self, run: Run, t: float) -> None:
        self._finish(run, t)
        if run.path.colocated:
            if run.req.done_hashes and run.p_hold is not None:
                self.stores[run.p_inst].commit_more(run.p_hold, run.req.done_hashes)
            self.stores[run.p_inst].release(run.p_hold)
            run.p_hold = None
        else:
            if run.req.done_hashes and run.m_hold is not None and run.m_state == "landed":
                self.stores[run.m_inst].commit_more(run.m_hold, run.req.done_hashes)
            self._main_release(run)

    def _finish(self, run: Run, t: float) -> None:
        if run.done:
            return
        run.done = True
        run.t_finish = t
        if run.t_first is None:
            run.t_first = t
        self._release_children(run, t)

    def _release_children(self, run: Run, t: float) -> None:
        for child in self._children.pop(run.req.rid, ()):
            self.loop.at(t + child.gap_s, self._arrive, child)

    def arrival_span_s(self) -> float:
        if not self.runs:
            return 0.0
        return max(r.arrival for r in self.runs) - min(r.arrival for r in self.runs)

    def _fail(self, run: Run, why: str) -> None:
        if run.failed is None:
            run.failed = why
            self._release_children(run, self.loop.now)
        if run.p_hold is not None:
            self.stores[run.p_inst].release(run.p_hold)
            run.p_hold = None
        self._relay_release(run)
        self._main_release(run)
