"""What the frontend counts from its workers' reports, for /metrics and the link estimates: KV
transfers per channel and link, prefill's timings and cache hits and its measured rate, the
deployment-wide gauges vLLM dashboards read. On the frontend's event loop."""

from __future__ import annotations

from dataclasses import replace

from pddflow.graph.plan import ChannelPlan, Plan
from pddflow.runtime.frontend.fleet import Fleet
from pddflow.runtime.frontend.flight import Flight, Flights
from pddflow.runtime.frontend.link_watch import LinkWatch
from pddflow.runtime.frontend.metrics import Metrics
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.scheduler import InstanceLoad, SchedulerState
from pddflow.scheduler.prefill_rate import PrefillRate


class Accounting:
    def __init__(
        self,
        plan: Plan,
        sched: SchedulerState,
        metrics: Metrics,
        links: LinkWatch,
        fleet: Fleet,
        flights: Flights,
    ):
        self.plan, self.sched, self.metrics = plan, sched, metrics
        self.links, self.fleet, self.flights = links, fleet, flights
        # each prefill instance's prefill rate as measured, for the SLA rule's queue prediction
        self.prefill_rates = {
            i.id: PrefillRate() for i in plan.instances if plan.operators[i.operator].type.prefills
        }

    def vllm_gauges(self) -> dict[str, float]:
        """Deployment-wide: requests queued at prefill (its legs not yet computed), the other
        live requests running, and KV blocks held over all instances' blocks."""
        up = self.fleet.up()
        waiting = sum(s.waiting for i, s in up.items() if self.plan.operator_of(i).type.prefills)
        total = sum(s.kv_blocks_total for s in up.values())
        live = len(self.flights)
        return {
            "running": max(live - waiting, 0),
            "waiting": min(waiting, live),
            "kv_usage": sum(s.kv_blocks_used for s in up.values()) / total if total else 0.0,
        }

    def prefill(self, inst: str, flight: Flight, e: pb.Event) -> None:
        """Prefill's queue and run time and its prefix cache's hit, once per request (its KV_SEND
        to each decoder carries them); the run time feeds the instance's measured rate."""
        r = flight.route
        if r.prefill_counted:
            return
        r.prefill_counted = True
        v = e.values
        cached = int(v.get("cached_tokens", 0))
        prefill_s = v.get("prefill_ms", 0.0) / 1e3
        prompt_len = flight.stream.prompt_len
        self.metrics.vllm.prefilled(prompt_len, cached, v.get("queued_ms", 0.0) / 1e3, prefill_s)
        rate = self.prefill_rates.get(inst)
        if rate is not None:
            rate.finished(prompt_len - cached, prefill_s)
            self.sched.prefill_s_per_token[inst] = rate.s_per_token()

    def entry_queues(self) -> None:
        """Prompt tokens each prefill instance has taken and not yet prefilled, for the SLA rule's
        queue prediction (exact here, not as of the instance's last status)."""
        pending = dict.fromkeys(self.prefill_rates, 0)
        for flight in self.flights:
            r = flight.route
            if r.prefill in pending and not r.prefill_counted:
                pending[r.prefill] += flight.stream.prompt_len
        off = self.fleet.unavailable  # keeps what the scheduler sees of it: no new work
        for inst, tokens in pending.items():
            if inst in off:
                continue
            load = self.sched.loads.get(inst) or InstanceLoad()
            self.sched.set_load(inst, replace(load, queued_tokens=tokens))

    def transfer(self, inst: str, e: pb.Event) -> None:
        """A KV transfer from `inst` started (KV_SEND) or ended (KV_SENT)."""
        ch = self._channel(inst, e.peer, e.channel)
        if ch is None:
            return
        transfer = (e.seq_id, inst, e.peer)
        if e.kind == pb.EVENT_KV_SENT:
            seconds = e.values.get("seconds", 0.0)
            self.metrics.kv_transfer.labels(ch.id).observe(seconds)
            if ch.link:
                self.links.ended(ch.link, transfer, e.values.get("bytes", 0.0), seconds)
        elif ch.link:  # counted when the transfer starts, even if later cancelled
            self.metrics.wan_bytes.labels(ch.link).inc(e.values.get("bytes", 0.0))
            self.metrics.wan_saved.labels(ch.link).inc(e.values.get("saved_bytes", 0.0))
            self.links.started(ch.link, transfer, e.values.get("bytes", 0.0))

    def transfer_failed(self, inst: str, f: pb.Failure) -> None:
        """A KV transfer from `inst` failed: its slot on its link is free again."""
        if f.kind != pb.FAILURE_KV_TRANSFER:
            return
        ch = self._channel(inst, f.peer, f.channel)
        if ch is not None and ch.link:
            self.links.ended(ch.link, (f.seq_id, inst, f.peer), None, None)

    def _channel(self, inst: str, peer: str, kind: str) -> ChannelPlan | None:
        src, dst = self.plan.instance(inst).operator, self.plan.instance(peer).operator
        return next((c for c in self.plan.channels_between(src, dst) if c.kind == kind), None)
