"""What the frontend counts from its workers' reports, for /metrics and the link estimates: KV
transfers per channel and link, prefill's timings and cache hits, the deployment-wide gauges vLLM
dashboards read. A mixin of `Frontend` (frontend.py), on the frontend's event loop."""

from __future__ import annotations

from pddflow.graph.plan import ChannelPlan
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.route import Live


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

    def _count_prefill(self, live: Live, e: pb.Event) -> None:
        """Prefill's queue and run time and its prefix cache's hit, once per request (its KV_SEND
        to each decoder carries them)."""
        r = live.route
        if r.prefill_counted:
            return
        r.prefill_counted = True
        v = e.values
        self.metrics.vllm.prefilled(
            live.state.prompt_len,
            int(v.get("cached_tokens", 0)),
            v.get("queued_ms", 0.0) / 1e3,
            v.get("prefill_ms", 0.0) / 1e3,
        )

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
            self.link_watch.started(ch.link, transfer)
