"""What the frontend counts from its workers' reports, for /metrics and the link estimates: KV
transfers per channel and link, prefill's timings and cache hits, the deployment-wide gauges vLLM
dashboards read. A mixin of `Frontend` (frontend.py), on the frontend's event loop."""

from __future__ import annotations

from dataclasses import replace

from pddflow.graph.plan import ChannelPlan
from pddflow.runtime.frontend.route import Live
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.scheduler import InstanceLoad


class Accounting:
    def _vllm_gauges(self) -> dict[str, float]:
        """Deployment-wide: requests queued at prefill (its legs not yet computed), the other
        live requests running, and KV blocks held over all instances' blocks."""
        up = {i: s for i, s in self.status.items() if i not in self.lost}
        waiting = sum(
            s.waiting
            for i, s in up.items()
            if self.plan.operator_of(i).op_type in ("prefill", "colocated")
        )
        total = sum(s.kv_blocks_total for s in up.values())
        return {
            "running": max(len(self.live) - waiting, 0),
            "waiting": min(waiting, len(self.live)),
            "kv_usage": sum(s.kv_blocks_used for s in up.values()) / total if total else 0.0,
        }

    def _count_prefill(self, inst: str, live: Live, e: pb.Event) -> None:
        """Prefill's queue and run time and its prefix cache's hit, once per request (its KV_SEND
        to each decoder carries them); the run time feeds the instance's measured rate."""
        r = live.route
        if r.prefill_counted:
            return
        r.prefill_counted = True
        v = e.values
        cached = int(v.get("cached_tokens", 0))
        prefill_s = v.get("prefill_ms", 0.0) / 1e3
        self.metrics.vllm.prefilled(
            live.state.prompt_len, cached, v.get("queued_ms", 0.0) / 1e3, prefill_s
        )
        rate = self.prefill_rates.get(inst)
        if rate is not None:
            rate.finished(live.state.prompt_len - cached, prefill_s)
            self.sched.prefill_s_per_token[inst] = rate.s_per_token()

    def _count_entry_queues(self) -> None:
        """Prompt tokens each entry instance has taken and not yet prefilled, for the SLA rule's
        queue prediction (exact here, not as of the instance's last status)."""
        pending = dict.fromkeys(self.prefill_rates, 0)
        for live in self.live.values():
            r = live.route
            if r.prefill in pending and not r.prefill_counted:
                pending[r.prefill] += live.state.prompt_len
        for inst, tokens in pending.items():
            load = self.sched.loads.get(inst) or InstanceLoad()
            self.sched.set_load(inst, replace(load, queued_tokens=tokens))

    def _channel(self, inst: str, peer: str, kind: str) -> ChannelPlan | None:
        src, dst = self.plan.instance(inst).operator, self.plan.instance(peer).operator
        return next((c for c in self.plan.channels_between(src, dst) if c.kind == kind), None)

    def _count_transfer(self, inst: str, e: pb.Event) -> None:
        ch = self._channel(inst, e.peer, e.channel)
        if ch is None:
            return
        transfer = (e.seq_id, inst, e.peer)
        if e.kind == pb.EVENT_KV_SENT:
            seconds = e.values.get("seconds", 0.0)
            self.metrics.kv_transfer.labels(ch.id).observe(seconds)
            if ch.link:
                self.link_watch.ended(ch.link, transfer, e.values.get("bytes", 0.0), seconds)
        elif ch.link:  # counted when the transfer starts, even if later cancelled
            self.metrics.wan_bytes.labels(ch.link).inc(e.values.get("bytes", 0.0))
            self.metrics.wan_saved.labels(ch.link).inc(e.values.get("saved_bytes", 0.0))
            self.link_watch.started(ch.link, transfer, e.values.get("bytes", 0.0))
