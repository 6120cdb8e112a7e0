"""What workers report of themselves, applied on the frontend's loop: each status (ready, load,
KV blocks, legs held, tiers) and each cache delta or full listing, kept in the router's mirror of
the worker's radix cache; a mirror that disagrees with the cache it mirrors is drift, listed in
/health and logged (docs/runtime.md)."""

from __future__ import annotations

import logging

from pddflow.graph.plan import Plan
from pddflow.runtime.frontend.fallbacks import Fallbacks
from pddflow.runtime.frontend.fleet import Fleet
from pddflow.runtime.frontend.metrics import Metrics
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.scheduler import InstanceLoad, MirrorDrift, Policy, SchedulerState
from pddflow.scheduler.features import UNAVAILABLE

log = logging.getLogger("pddflow.frontend")


class StatusReports:
    def __init__(
        self,
        plan: Plan,
        policy: Policy,
        sched: SchedulerState,
        metrics: Metrics,
        fleet: Fleet,
        fallbacks: Fallbacks,
    ):
        self.plan, self.policy, self.sched, self.metrics = plan, policy, sched, metrics
        self.fleet, self.fallbacks = fleet, fallbacks
        self.drift: list[str] = []

    def on_cache(self, inst: str, delta: pb.CacheDelta) -> None:
        m = self.sched.mirror(inst)
        if m is None:
            return
        try:
            if delta.full:
                m.reset(delta.inserted, delta.inserted_tier)
                return
            m.on_evict(delta.evicted)
            m.on_insert(delta.inserted, delta.inserted_tier)
            if delta.moved:
                m.on_move(delta.moved, delta.moved_tier)
        except MirrorDrift as exc:
            self.drift_seen(str(exc))

    def on_status(self, inst: str, s: pb.WorkerStatus, listed: bool = True) -> None:
        if inst in self.fleet.parked:
            return  # a report that left before it was stopped
        self.fleet.status[inst] = s
        if s.kv_bytes_per_token:  # transfers are sized by the KV the served model moves
            self.policy.kv_bytes_per_token = s.kv_bytes_per_token
        self.sched.measured_tiers(inst, s.tiers)  # a hit below the device: its load's rate
        self.fallbacks.reap_orphans(inst, s.legs)
        if inst in self.fleet.lost and s.ready:
            self.fallbacks.worker_back(inst)
        elif s.ready:
            self.metrics.worker_up.labels(inst).set(1)
        if s.ready and inst in self.fleet.starting:  # live scaling's new instance joins
            self.fleet.starting.discard(inst)
            log.warning("%s joins its pool", inst)
        op = self.plan.operator_of(inst)
        load = InstanceLoad(
            running=s.running,
            queued=s.waiting,
            max_batch=op.max_batch,
            kv_used=s.kv_blocks_used / max(s.kv_blocks_total, 1),
        )
        off = inst in self.fleet.draining or inst in self.fleet.starting
        self.sched.set_load(inst, UNAVAILABLE if off else load)
        self.metrics.queue_depth.labels(inst).set(s.running + s.waiting)
        self.metrics.kv_blocks_used.labels(inst).set(s.kv_blocks_used)
        self.metrics.kv_blocks_total.labels(inst).set(s.kv_blocks_total)
        m = self.sched.mirror(inst)
        # deltas precede the status on the same ordered stream: they must agree now
        if m is not None and listed:
            if len(m) != s.cached_blocks or m.digest != s.cache_digest:
                self.drift_seen(f"{inst}: mirror holds {len(m)} blocks, cache {s.cached_blocks}")

    def drift_seen(self, msg: str) -> None:
        if msg not in self.drift:
            self.drift.append(msg)
            log.error("radix mirror drift: %s", msg)
