"""Rank-to-rank KV over rdma_tensor between tensor-parallel instances (docs/runtime.md, Ranks):
each sending rank sends its own KV heads straight to the receiving ranks that hold them, and each
receiving rank joins the pieces of its heads. The leader's worker and every follower rank use
these; the engine's SHIP and LAND steps (operators/tp_steps.py) say when."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from pddflow.channels.errors import ChannelError
from pddflow.channels.transfer import TransferReport
from pddflow.core.channel_kinds import Kind
from pddflow.core.payloads import KVBlocks
from pddflow.graph.plan import Plan, rank_name
from pddflow.operators.kv_shards import head_routes
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.wiring import Wiring
from pddflow.runtime.workers.connections import (
    channel_to,
    pump_kv,
    rdma_receivers,
    rdma_sender,
)


def rank_to_rank(plan: Plan, src: str, dst: str, kind: str) -> bool:
    """Whether KV from instance src to dst goes rank to rank: over rdma_tensor when either end
    has several ranks (one NIC per rank; over the WAN one copy goes through the leaders)."""
    ranks = plan.operator_of(src).ranks, plan.operator_of(dst).ranks
    return kind == Kind.RDMA_TENSOR and max(ranks) > 1


def send_shards(
    kv: KVBlocks,
    num_kv_heads: int,
    src: tuple[int, int],
    dst_ranks: int,
    sender: Callable[[int], Any],
    timeout_s: float,
) -> list[Future]:
    """Send rank src[1]-of-src[0]'s heads of kv (kv.heads) to each receiving rank that holds
    some: one piece per (receiving rank, head range), its own checksums where the transport sums
    them. No piece when another sending rank owns these heads."""
    a = kv.heads[0] if kv.heads else 0
    futures = []
    for route in head_routes(num_kv_heads, src[0], dst_ranks):
        if route.src != src[1]:
            continue
        data = kv.data.narrow(4, route.lo - a, route.hi - route.lo).contiguous()
        piece = replace(kv, data=data, heads=(route.lo, route.hi))
        futures.append(sender(route.dst).send_async(piece, timeout_s=timeout_s))
    return futures


def planned_bytes(kv: KVBlocks, block_bytes: int, num_kv_heads: int, ranks: tuple[int, int]):
    """The bytes every rank's pieces of kv make together (a head two receiving ranks share
    counts twice)."""
    heads = sum(r.hi - r.lo for r in head_routes(num_kv_heads, *ranks))
    return kv.num_blocks * block_bytes * heads // num_kv_heads


def joined(futures: list[Future], total_bytes: int) -> Future:
    """One future for a rank's sends: the first failure, else one report of them all (bytes:
    total_bytes, every rank's)."""
    out: Future = Future()
    left = [len(futures)]
    lock = threading.Lock()

    def done(_: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0] or out.done():
                return
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            out.set_exception(errors[0])
            return
        reports = [f.result() for f in futures]
        first = reports[0]
        out.set_result(
            TransferReport(
                first.transfer_id,
                first.seq_id,
                max(r.num_blocks for r in reports),
                total_bytes,
                max(r.seconds for r in reports),
                sum(r.resent_blocks for r in reports),
                sum(r.reconnects for r in reports),
            )
        )

    if not futures:
        out.set_exception(ChannelError("no KV piece to send (no receiving rank holds these heads)"))
    for f in futures:
        f.add_done_callback(done)
    return out


class ShardAssembler:
    """Pieces of this rank's KV heads from the sending ranks, joined once they cover them. Pieces
    that never complete are dropped after ttl_s (a transfer that failed on one connection)."""

    def __init__(self, heads: tuple[int, int], ttl_s: float):
        self.heads, self.ttl_s = heads, ttl_s
        self._lock = threading.Lock()
        self._parts: dict[tuple[str, int], tuple[float, dict[int, KVBlocks]]] = {}
        self._done: dict[tuple[str, int], tuple[float, KVBlocks]] = {}

    def add(self, piece: KVBlocks) -> tuple[KVBlocks, int] | None:
        """The whole of this rank's heads once `piece` completes them, and of how many pieces;
        else None."""
        a, b = self.heads
        lo, hi = piece.heads or (a, b)
        if not a <= lo < hi <= b:
            raise ChannelError(
                f"a KV piece of heads [{lo}, {hi}) of {piece.seq_id} reached the rank holding "
                f"heads [{a}, {b})"
            )
        key = (piece.seq_id, piece.token_start)
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            first, parts = self._parts.get(key, (now, {}))
            if any(p.token_end != piece.token_end for p in parts.values()):
                first, parts = now, {}  # a newer send of this range: start over
            parts[lo] = piece
            at, order = a, []
            while at in parts:
                order.append(parts[at])
                at = parts[at].heads[1] if parts[at].heads else b
            if at != b:
                self._parts[key] = (first, parts)
                return None
            self._parts.pop(key, None)
        if len(order) == 1:
            data = order[0].data
        else:
            import torch  # several ranks' heads: a tensor-parallel, so a real, engine's

            data = torch.cat([p.data for p in order], dim=4)
        # prefill's first token rides on the sending leader's pieces only
        first = next((p.first for p in order if p.first is not None), None)
        return replace(piece, data=data, heads=self.heads, first=first), len(order)

    def put(self, piece: KVBlocks) -> None:
        """A follower's: keep the joined heads for `take`."""
        joined = self.add(piece)
        if joined is not None:
            whole = joined[0]
            with self._lock:
                self._done[(whole.seq_id, whole.token_start)] = (time.monotonic(), whole)

    def take(self, seq_id: str, token_start: int) -> Any:
        with self._lock:
            entry = self._done.pop((seq_id, token_start), None)
        return None if entry is None else entry[1].data

    def pending(self) -> int:
        with self._lock:
            return len(self._parts) + len(self._done)

    def _expire(self, now: float) -> None:
        for table in (self._parts, self._done):
            for key in [k for k, v in table.items() if now - v[0] > self.ttl_s]:
                del table[key]


def shard_ttl_s(plan: Plan, operator: str) -> float:
    """How long pieces wait for the rest: twice the longest rdma_tensor deadline at operator."""
    deadlines = [
        float(ch.params["deadline_s"])
        for ch in plan.channels
        if ch.kind == Kind.RDMA_TENSOR and operator in (ch.src, ch.dst)
    ]
    return 2 * max(deadlines, default=10.0)


class FollowerKV:
    """A follower rank's part of rank-to-rank KV (the engine's RankKV): its own receivers, its
    senders to the receiving ranks, and its joined heads waiting for the leader's LAND."""

    def __init__(self, wiring: Wiring, instance: str, rank: int, engine: Any):
        self.wiring, self.instance, self.rank = wiring, instance, rank
        self.plan = wiring.plan()
        self.operator = self.plan.instance(instance).operator
        self.name = rank_name(instance, rank)
        self.num_kv_heads = engine.model_config.num_kv_heads
        self.shards = ShardAssembler(engine.kv_heads, shard_ttl_s(self.plan, self.operator))
        self.closed = threading.Event()
        self._senders: dict[tuple[str, int], Any] = {}
        self.receivers: list[Any] = []
        for ch in self.plan.channels:
            if ch.dst == self.operator and ch.kind == Kind.RDMA_TENSOR and not self.receivers:
                self.receivers = rdma_receivers(wiring, ch, instance, rank)
        for r in self.receivers:
            threading.Thread(target=self._pump, args=(r,), daemon=True, name="rank-kv").start()

    def ship(self, kv: KVBlocks, route: bytes) -> None:
        where = pb.RankRoute.FromString(route)
        ranks = self.plan.operator_of(self.instance).ranks
        futures = send_shards(
            kv,
            self.num_kv_heads,
            (ranks, self.rank),
            self.plan.operator_of(where.peer).ranks,
            lambda dst: self._sender(where.peer, dst),
            where.timeout_s,
        )
        for f in futures:
            f.add_done_callback(lambda f, sid=kv.seq_id: self._sent(sid, where.peer, f))

    def take(self, seq_id: str, token_start: int) -> Any:
        return self.shards.take(seq_id, token_start)

    def _sender(self, peer: str, rank: int) -> Any:
        key = (peer, rank)
        if key not in self._senders:
            ch = channel_to(self.plan, self.instance, Kind.RDMA_TENSOR, peer)
            self._senders[key] = rdma_sender(self.wiring, ch, self.instance, peer, rank)
        return self._senders[key]

    def _sent(self, seq_id: str, peer: str, fut: Future) -> None:
        # the receiving instance sees the piece missing and fails the whole transfer
        if fut.exception() is not None:
            print(f"{self.name}: KV of {seq_id} to {peer} failed: {fut.exception()}", flush=True)

    def _pump(self, receiver: Any) -> None:
        # a failed piece is only logged: the leader's LAND finds it missing
        pump_kv(
            receiver,
            self.closed,
            self.shards.put,
            lambda exc: print(f"{self.name}: {exc}", flush=True),
        )

    def close(self) -> None:
        self.closed.set()
        for s in self._senders.values():
            s.close()
        for r in self.receivers:
            r.close()
