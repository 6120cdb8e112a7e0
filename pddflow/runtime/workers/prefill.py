"""Prefill: compute the prompt's KV and first token, then ship the KV two ways at once (PDD's
dual-path KV): the whole prompt to the relay over RDMA, and to main decode over the WAN only the
blocks main's radix cache lacks. The first token travels with each copy."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from pddflow.core.kv_reuse import reused_blocks
from pddflow.core.payloads import FirstToken, KVBlocks
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.workers.loop import Leg, Worker, first_token
from pddflow.runtime.workers.rank_kv import joined, planned_bytes, rank_to_rank, send_shards
from pddflow.runtime.workers.registry import runs


@dataclass(eq=False)
class PrefillLeg(Leg):
    queued_ms: float = 0.0  # order received -> prefill started
    prefill_ms: float = 0.0
    prefill_cpu_ms: float = 0.0  # wall >> CPU: the prefill waited for its core
    cached_tokens: int = 0  # prompt tokens the prefix cache gave


@runs("prefill")
class PrefillWorker(Worker):
    leg_type = PrefillLeg
    prefills = True

    def on_order(self, leg: PrefillLeg) -> None:
        self.compute_queue.append(leg)

    def compute(self, leg: PrefillLeg) -> None:
        try:
            leg.cached_tokens = self.engine.reuse_prefix(leg.seq)
            t0, c0 = time.monotonic(), time.thread_time()
            self.engine.prefill(leg.seq)
            leg.queued_ms = (t0 - leg.received) * 1e3
            leg.prefill_ms = (time.monotonic() - t0) * 1e3
            leg.prefill_cpu_ms = (time.thread_time() - c0) * 1e3
            if leg.seq.finished:  # the first token ended it: nobody needs the KV
                self.emit_last(leg, leg.cached_tokens)
            else:  # the first token travels with the KV to the decoders that continue from it
                self._ship_kv(leg)
            self.finish(leg)
        except Exception as exc:  # noqa: BLE001 - one request's failure must not stop the worker
            self.fail(leg, pb.FAILURE_COMPUTE, exc)

    def _ship_kv(self, leg: PrefillLeg) -> None:
        order, seq, block_bytes = leg.order, leg.seq, self.engine.block_bytes
        first = first_token(seq, leg.cached_tokens)
        targets = []
        if order.relay:
            targets.append((order.relay, 0))
        if order.main and not order.singular:
            reused = reused_blocks(
                order.main_cached_blocks, seq.num_prompt_tokens, self.engine.block_size
            )
            targets.append((order.main, reused))
        for peer, start_block in targets:
            kind = self.io.kv_kind_to(peer)
            timeout = max(0.1, min(leg.deadline - time.monotonic(), self.io.deadline_s(kind, peer)))
            t0 = time.monotonic()
            if rank_to_rank(self.plan, self.instance, peer, kind):
                kv, send = self._ship_by_ranks(leg, peer, kind, start_block, timeout, first)
            else:
                kv = replace(self.engine.export_kv(seq, start_block=start_block), first=first)
                send = partial(self.io.sender(kind, peer).send_async, kv, timeout_s=timeout)
            values = {
                "bytes": kv.num_blocks * block_bytes,
                "saved_bytes": start_block * block_bytes,
                "queued_ms": leg.queued_ms,
                "prefill_ms": leg.prefill_ms,
                "prefill_cpu_ms": leg.prefill_cpu_ms,
                "cached_tokens": leg.cached_tokens,
                "export_ms": (time.monotonic() - t0) * 1e3,
            }
            self.io.event(seq.seq_id, pb.EVENT_KV_SEND, channel=kind, peer=peer, **values)
            sent_at = time.monotonic()
            fut = send()
            fut.add_done_callback(
                lambda f, peer=peer, kind=kind, t0=sent_at, sid=seq.seq_id: self._kv_sent(
                    sid, peer, kind, t0, f
                )
            )

    def _ship_by_ranks(
        self,
        leg: PrefillLeg,
        peer: str,
        kind: str,
        start_block: int,
        timeout: float,
        first: FirstToken,
    ) -> tuple[KVBlocks, Callable[[], Future]]:
        """Every rank of this instance sends its own heads to the peer's ranks holding them; the
        leader's own KV, and how it sends its pieces (the first token rides on the leader's)."""
        route = pb.RankRoute(peer=peer, timeout_s=timeout).SerializeToString()
        kv = replace(self.engine.ship_kv(leg.seq, route, start_block), first=first)
        heads = self.engine.model_config.num_kv_heads
        ranks = (self.op.ranks, self.plan.operator_of(peer).ranks)
        total = planned_bytes(kv, self.engine.block_bytes, heads, ranks)

        def send() -> Future:
            to = partial(self.io.sender, kind, peer)
            return joined(send_shards(kv, heads, (ranks[0], 0), ranks[1], to, timeout), total)

        return kv, send

    def _kv_sent(self, seq_id: str, peer: str, kind: str, t0: float, fut: Any) -> None:
        """On a channel thread: the send ended."""
        exc = fut.exception()
        if exc is not None:
            self.io.fail(seq_id, pb.FAILURE_KV_TRANSFER, str(exc), peer=peer, channel=kind)
            return
        r = fut.result()
        values = {
            "bytes": r.bytes,
            "seconds": time.monotonic() - t0,
            "blocks": r.num_blocks,
            "reconnects": r.reconnects,
            "resent_blocks": r.resent_blocks,
        }
        self.io.event(seq_id, pb.EVENT_KV_SENT, channel=kind, peer=peer, **values)
