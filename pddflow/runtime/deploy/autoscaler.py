"""The planner in a deployment (docs/runtime.md, The planner): a thread that samples each pool on
the frontend's loop every second and, every `interval_s`, asks the planner (pddflow/planner) for
each pool's count and applies it with `Deployment.scale`. One replica's capacity is what this
deployment measured: a prefill instance's prefill seconds per uncached token (the scheduler's own
measure), and each decoder's step seconds against its batch, from its status reports."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge

from pddflow.graph.plan import Plan
from pddflow.planner import Meter, Planner, PoolDecision, PoolLoad
from pddflow.planner.capacity import StepFit
from pddflow.planner.policy import direction_changes
from pddflow.runtime.frontend.frontend import Frontend
from pddflow.runtime.frontend.loop_call import LoopStopped
from pddflow.scheduler import RequestFeatures

log = logging.getLogger("pddflow.planner")
SAMPLE_S = 1.0
KEEP_CHANGES = 500  # the decisions that changed a count, for /health


class Autoscaler:
    def __init__(
        self, plan: Plan, frontend: Frontend, scale: Callable[[str, int, Callable], object]
    ):
        """`scale(operator, replicas, say)`: the deployment's (`Deployment.scale`)."""
        self.plan, self.fe, self.scale = plan, frontend, scale
        a = plan.autoscale
        self.interval_s = a.interval_s
        self.planner = Planner.for_plan(plan)
        self.meter = Meter.for_autoscale(a)
        self.tpot_s = plan.scheduler.tpot_ms / 1e3
        self.steps = {n: StepFit() for n, op in plan.operators.items() if op.type.decodes}
        self._seen: dict[str, tuple[int, int, float]] = {}  # instance -> its decode counters
        self._cache_link = frontend.policy.topo.cache_links
        self.changes: deque[PoolDecision] = deque(maxlen=KEEP_CHANGES)
        self.last: dict[str, PoolDecision] = {}
        self.t0 = time.monotonic()
        self.timeline = {n: [(0.0, self._running(n))] for n in plan.operators}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        r = frontend.metrics.registry
        self.m_target = Gauge(
            "pddflow_planner_target_replicas", "the planner's count per pool", ["operator"],
            registry=r,
        )  # fmt: skip
        self.m_util = Gauge(
            "pddflow_planner_utilization",
            "the pool's measured load over its replicas' capacity within the SLA",
            ["operator"],
            registry=r,
        )
        self.m_decisions = Counter(
            "pddflow_planner_decisions",
            "the planner's decisions per pool: up, down or hold",
            ["operator", "direction"],
            registry=r,
        )

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pddflow-planner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        next_decision = time.monotonic() + self.interval_s
        while not self._stop.wait(SAMPLE_S):
            try:
                self.fe._on_loop(self._sample)
                if time.monotonic() >= next_decision:
                    next_decision = time.monotonic() + self.interval_s
                    for name in self.plan.operators:
                        if self._stop.is_set():
                            return
                        self._decide(name)
            except LoopStopped:  # the server ended: nothing left to measure or scale
                return
            except Exception:  # noqa: BLE001 - the planner must not stop serving; it says why
                log.exception("planner: this round failed; the next one tries again")

    # ---- measurements (on the frontend's loop) --------------------------------------------------
    def arrived(self, prefill: str, req: RequestFeatures) -> None:
        """A request routed to prefill instance `prefill`: its prompt tokens that instance's mirror
        does not hold."""
        m = self.fe.sched.mirror(prefill)
        hit = req.cached_tokens(m.match(req.block_hashes)) if m is not None else 0
        op = self.plan.operator_of(prefill).name
        self.meter.arrived(time.monotonic(), op, req.prompt_tokens - hit)

    def _sample(self) -> None:
        fe, now = self.fe, time.monotonic()
        off = fe.fleet.unavailable
        for name, fit in self.steps.items():
            seqs = 0
            for inst in self.plan.operators[name].instances:
                s = fe.fleet.status.get(inst)
                if s is None or inst in fe.fleet.parked:
                    continue
                seen = (s.decode_steps, s.decode_seqs, s.decode_wall_s)
                before = self._seen.get(inst)
                self._seen[inst] = seen
                if before is not None and seen[0] > before[0]:
                    fit.add(seen[0] - before[0], seen[1] - before[1], seen[2] - before[2])
                if inst not in off:
                    seqs += s.running + s.waiting
            self.meter.held(now, name, seqs, 0.0)
        for link in set(self._cache_link.values()):
            sent = fe.metrics.registry.get_sample_value(
                "pddflow_wan_bytes_sent_total", {"link": link}
            )
            self.meter.sent(now, link, sent or 0.0)

    def _load(self, name: str) -> PoolLoad:
        fe, now = self.fe, time.monotonic()
        op = self.plan.operators[name]
        load: dict[str, Any] = {}
        serving = [i for i in op.instances if i not in fe.fleet.unavailable]
        if op.type.prefills:
            rates = [fe.sched.prefill_s_per_token.get(i, 0.0) for i in serving]
            rates = [r for r in rates if r > 0]
            queued = sum(
                f.stream.prompt_len
                for f in fe.flights
                if f.route.prefill in op.instances and not f.route.prefill_counted
            )
            load.update(
                prompt_work=self.meter.prompt_rate(now, name),
                prompt_queued=float(queued),
                prefill_capacity=len(rates) / sum(rates) if rates else None,
            )
        if op.type.decodes:
            seqs, _ = self.meter.sequences(now, name)
            load.update(
                sequences=seqs,
                decode_capacity=self.steps[name].batch_within(self.tpot_s, op.max_batch),
            )
        link = self._cache_link.get(name)
        if link is not None:
            gbps = self.plan.links[link].gbps
            load["link_utilization"] = self.meter.link_share(now, link, gbps)
        return PoolLoad(name, **load)

    def _running(self, name: str) -> int:
        parked = self.fe.fleet.parked
        return sum(1 for i in self.plan.operators[name].instances if i not in parked)

    # ---- decisions (this thread) ---------------------------------------------------------------
    def _decide(self, name: str) -> None:
        load = self.fe._on_loop(lambda: self._load(name))
        now = time.monotonic() - self.t0
        d = self.planner.decide(now, load, self._running(name))
        self.last[name] = d
        direction = "up" if d.target > d.current else "down" if d.target < d.current else "hold"
        self.m_decisions.labels(name, direction).inc()
        self.m_target.labels(name).set(d.target)
        if d.utilization is not None:
            self.m_util.labels(name).set(d.utilization)
        if not d.changes:
            log.debug("planner: %s %s", name, d.reason)
            return
        self.changes.append(d)
        log.warning("planner: %s %s", name, d.reason)
        say: Callable[[str], None] = log.warning
        try:
            self.scale(name, d.target, say=say)
        except Exception as exc:  # noqa: BLE001 - ScaleError or a lost worker: reported, retried
            log.warning("planner: scaling %s to %d failed: %s", name, d.target, exc)
        self.timeline[name].append((round(time.monotonic() - self.t0, 3), self._running(name)))

    # ---- what /health shows ------------------------------------------------------------------
    def report(self) -> dict:
        """What /health shows (on the frontend's loop while this thread decides: every container
        is copied first, a copy being one step for the interpreter)."""
        last = dict(self.last)
        timeline = {k: list(v) for k, v in list(self.timeline.items())}
        return {
            "interval_s": self.interval_s,
            "bounds": {k: list(v) for k, v in self.planner.bounds.items()},
            "last": {k: d.as_json() for k, d in last.items()},
            "changes": [d.as_json() for d in list(self.changes)],
            "timeline": {k: [list(p) for p in v] for k, v in timeline.items()},
            "direction_changes": {
                k: direction_changes([n for _, n in v]) for k, v in timeline.items()
            },
        }
