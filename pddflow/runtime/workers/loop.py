"""The loop every worker role shares: admit what arrived, run one model step, report. Other threads
only put typed messages on the inbox; the engine and the legs are touched on the loop thread."""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from pddflow.channels.errors import ChannelError
from pddflow.core.payloads import FirstToken, TokenLogprob
from pddflow.graph.plan import OperatorPlan
from pddflow.operators.cache_state import cache_changes, cache_listing, cached_hashes
from pddflow.operators.engine_core import TPPeerLost
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.rpc import WORKER, serve
from pddflow.runtime.wire import logprobs_to_pb, sampling_from_pb
from pddflow.runtime.wiring import Wiring
from pddflow.runtime.workers.cache_report import delta, tier_stats
from pddflow.runtime.workers.connections import WorkerIO
from pddflow.runtime.workers.ended_runs import EndedRuns
from pddflow.runtime.workers.inbox import (
    Abort,
    CaughtUp,
    HandoffDelivered,
    HandoffUndeliverable,
    InboxItem,
    KVArrived,
    KVLost,
    LegOrdered,
    MainLanded,
)
from pddflow.runtime.workers.rank_kv import ShardAssembler, shard_ttl_s
from pddflow.runtime.workers.ranks import build_engine

STATUS_EVERY_S = 0.5
EARLY_KEEP_S = 60.0  # inputs that arrive before their order are kept this long
# only a running leg makes these (main's KV lands long after the relay's order, sent with main's,
# has arrived: prefill computed and the WAN carried the KV meanwhile)
AFTER_START = (CaughtUp, HandoffDelivered, HandoffUndeliverable, MainLanded)


@dataclass(eq=False)
class Leg:
    """One request on this worker; each role extends it with what only it needs."""

    order: pb.LegOrder
    deadline: float
    received: float  # when the order reached this process
    seq: Any = None  # the engine's Sequence

    @property
    def seq_id(self) -> str:
        return self.order.seq_id


def last_logprob(seq: Any) -> list[TokenLogprob] | None:
    """The log probability of the sequence's newest token, when its request asked."""
    return [seq.logprobs[-1]] if seq.sampling.logprobs is not None and seq.logprobs else None


def first_token(seq: Any, cached_tokens: int) -> FirstToken:
    """The token a prefill of `seq` just sampled, as it travels with the KV to the decoders."""
    lps = last_logprob(seq)
    return FirstToken(seq.output_ids[-1], lps[0] if lps else None, cached_tokens)


def hands_off(order: pb.LegOrder) -> bool:
    """The order's relay hands the request over to its main (P-RLD-MD, not finished alone)."""
    return bool(order.relay and order.main and order.handoff and not order.singular)


def not_renewed(legs: Iterable[Leg], now: float, lease_until: float) -> list[Leg]:
    """No grant came for the lease: the legs ordered before it ran out are given up. One ordered
    since came from a frontend that reaches this worker again: its grant is on its way."""
    return [] if now <= lease_until else [g for g in legs if g.received < lease_until]


def revoked_legs(legs: Iterable[Leg], epoch: int) -> list[Leg]:
    """The frontend gave up the legs it ordered before lease epoch `epoch` (frontend/leases.py);
    those ordered since, once this worker was back, stay whenever the revoking grant arrives."""
    return [g for g in legs if g.order.lease_epoch < epoch]


class Worker:
    leg_type: type[Leg] = Leg
    # what the class can do (workers/registry.py checks them against the operator types it runs)
    prefills = decodes = relays = takes_handoff = False

    def __init__(self, wiring: Wiring, instance: str):
        self.wiring, self.instance = wiring, instance
        self.plan = wiring.plan()
        self.op: OperatorPlan = self.plan.operator_of(instance)
        self.inbox: queue.Queue[InboxItem] = queue.Queue()
        self.stopping = threading.Event()
        self.io = WorkerIO(wiring, self.plan, instance, self.inbox)
        self.engine = build_engine(wiring, instance, 0)  # the leader of the instance's ranks
        # the leader's heads of rank-to-rank KV, joined from the sending ranks' pieces
        self.shards = ShardAssembler(self.engine.kv_heads, shard_ttl_s(self.plan, self.op.name))
        self.legs: dict[str, Leg] = {}
        self.ended = EndedRuns()  # told again when their report stream reopens (retell)
        self.early: dict[str, tuple[float, list[InboxItem]]] = {}  # seq_id -> (first seen, items)
        self.compute_queue: list[Leg] = []  # prefills and extends, in arrival order
        self._last_status = 0.0
        self._status = pb.WorkerStatus(instance=instance, ready=False)
        # the frontend's lease on this worker's legs: renewed by its heartbeat's grants (RPC
        # threads write it); the first comes within a heartbeat of our first status (run())
        self.lease_until = float("inf")
        # the frontend gave up our legs ordered before this lease epoch; a grant saying so is
        # pending until the loop drops them (RPC threads write both, under the lock)
        self.revoked_epoch = 0
        self._revoke_pending = False
        self._revoked_lock = threading.Lock()
        self.lease_lapses = 0
        put = self._enqueue
        self.rpc, _ = serve(
            WORKER,
            wiring.credentials(),
            {
                "Submit": (pb.LegOrder, pb.Reply, lambda m: put(LegOrdered(m, time.monotonic()))),
                "Abort": (pb.Cancel, pb.Reply, lambda m: put(Abort(m.seq_id, m.reason))),
                "Recompute": (pb.Cancel, pb.Reply, lambda m: put(KVLost(m.seq_id, m.reason))),
                "Status": (pb.Empty, pb.WorkerStatus, lambda _: self._status),
                "TuneLink": (pb.LinkTuning, pb.LinkTuned, self.io.tune_link),
                "Lease": (pb.LeaseGrant, pb.Reply, self._granted),
            },
            port=int(wiring.workers[instance].rpc.rsplit(":", 1)[1]),
            host=wiring.bind_host(wiring.workers[instance].rpc),
        )

    def _granted(self, grant: pb.LeaseGrant) -> pb.Reply:
        if grant.held:
            self.lease_until = time.monotonic() + grant.lease_s
        else:
            with self._revoked_lock:
                self.revoked_epoch = max(self.revoked_epoch, grant.epoch)
                self._revoke_pending = True
        return pb.Reply(ok=True)

    def _enqueue(self, item: InboxItem) -> pb.Reply:
        self.inbox.put(item)
        return pb.Reply(ok=True)

    def run(self) -> None:
        """Until stopped; a rank of the instance lost ends it (TPPeerLost): the instance is lost,
        and the deployer restarts all its ranks."""
        self.lease_until = min(self.lease_until, time.monotonic() + self.wiring.lease_s)
        self.publish()  # the whole (empty) cache listing, then the status: the mirror starts exact
        while not self.stopping.is_set():
            try:
                started, idle = time.monotonic(), self.idle()
                self.admit(block=idle)
                if idle:  # waiting for work is no step's cost
                    started = time.monotonic()
                self.step()
                self.expire()
                self.publish()
                self.iterated(time.monotonic() - started)
            except TPPeerLost:
                raise
            except Exception:  # noqa: BLE001 - one request's bug must not take the worker down
                traceback.print_exc()

    def idle(self) -> bool:
        return not self.compute_queue

    def step(self) -> None:
        if self.compute_queue:
            self.compute(self.compute_queue.pop(0))

    def iterated(self, wall_s: float) -> None:
        """One loop iteration took `wall_s`."""

    def wait_s(self) -> float:
        """How long an idle loop waits for input before it looks again."""
        return 0.05

    def admit(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=self.wait_s()) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self.handle(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def handle(self, item: InboxItem) -> None:
        if isinstance(item, LegOrdered):
            self._start_leg(item)
            return
        if isinstance(item, KVArrived) and item.kv.heads is not None:
            try:
                joined = self.shards.add(item.kv)
            except ChannelError as exc:
                joined, item = None, KVLost(item.seq_id, str(exc))
            if joined is not None:  # a TP 1 instance holds every head: the plain landing
                whole, pieces = joined
                every = (0, self.engine.model_config.num_kv_heads)
                heads = None if whole.heads == every else whole.heads
                item = KVArrived(replace(whole, heads=heads), item.arrived, pieces)
            elif isinstance(item, KVArrived):
                return
        leg = self.legs.get(item.seq_id)
        if leg is None and isinstance(item, AFTER_START):
            return  # its leg has ended
        if leg is None:  # arrived before its order (or after its end): keep it a while
            self.early.setdefault(item.seq_id, (time.monotonic(), []))[1].append(item)
        elif isinstance(item, Abort):
            self.finish(leg, reason=item.reason)
        else:
            self.on_input(leg, item)

    def _start_leg(self, arrived: LegOrdered) -> None:
        order = arrived.order
        sampling = sampling_from_pb(order.sampling)
        timeout = order.timeout_s or self.wiring.leg_timeout_s
        leg = self.leg_type(order, arrived.received + timeout, arrived.received)
        try:
            leg.seq = self.engine.add_sequence(list(order.prompt_ids), sampling, order.seq_id)
            if order.output_offset:  # resumed: the prompt holds the output streamed so far
                leg.seq.output_start = len(order.prompt_ids) - order.output_offset
        except ValueError as exc:
            self.io.fail(order.seq_id, pb.FAILURE_COMPUTE, str(exc))
            return
        self.legs[order.seq_id] = leg
        self.on_order(leg)
        for item in self.early.pop(order.seq_id, (0.0, []))[1]:
            self.handle(item)

    def on_order(self, leg: Leg) -> None:
        raise NotImplementedError

    def on_input(self, leg: Leg, item: InboxItem) -> None:
        """An input other than the order and an abort (which the loop handles)."""

    def compute(self, leg: Leg) -> None:
        raise NotImplementedError

    def _run(self, leg: Leg) -> pb.Tokens:
        """The leg's whole output as one run (its final report's flags)."""
        seq = leg.seq
        run = pb.Tokens(
            seq_id=leg.seq_id,
            start=leg.order.output_offset,
            ids=seq.output_ids,
            final=seq.finished,
            finish_reason=seq.finish_reason or "",
        )
        # a decoder holds no log probabilities for the IDs it extended over: then none
        whole = seq.sampling.logprobs is not None and len(seq.logprobs) == len(seq.output_ids)
        return logprobs_to_pb(run, seq.logprobs if whole else None)

    def emit(
        self,
        leg: Leg,
        ids: list[int],
        start: int,
        lps: list[TokenLogprob] | None = None,
        cached_tokens: int = 0,
    ) -> None:
        """Tokens for the client, sent with the rest of this step's (`publish`); the run at
        position 0 says how many prompt tokens a prefix cache gave."""
        seq = leg.seq
        tokens = pb.Tokens(
            seq_id=leg.seq_id,
            start=start,
            ids=ids,
            final=seq.finished,
            finish_reason=seq.finish_reason or "",
            cached_tokens=cached_tokens,
        )
        self.io.tokens(logprobs_to_pb(tokens, lps), leg.order.reply_to)

    def emit_last(self, leg: Leg, cached_tokens: int = 0) -> None:
        """The sequence's newest token (just sampled here), at its position in the client's
        output, with its log probability when the order asked."""
        seq = leg.seq
        start = len(seq.output_ids) - 1 + leg.order.output_offset
        self.emit(leg, [seq.output_ids[-1]], start, last_logprob(seq), cached_tokens)

    def finish(self, leg: Leg, reason: str = "") -> None:
        self.legs.pop(leg.seq_id, None)
        if leg.seq is not None and leg.seq.finished and leg.seq.output_ids:
            self.ended.add(leg.order.reply_to, self._run(leg))
        if leg in self.compute_queue:
            self.compute_queue.remove(leg)
        if leg.seq is not None and leg.seq.block_table is not None:
            self.engine.free(leg.seq)

    def fail(self, leg: Leg, kind: pb.FailureKind.ValueType, exc: BaseException) -> None:
        self.io.fail(leg.seq_id, kind, f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
        self.finish(leg, reason=str(exc))

    def expire(self) -> None:
        now = time.monotonic()
        with self._revoked_lock:
            revoked, self._revoke_pending = self._revoke_pending, False
        old = not_renewed(self.legs.values(), now, self.lease_until)
        if old:  # and what arrived for orders not seen before the lease ran out
            self._lease_lapsed("not renewed", old)
            self.early = {s: e for s, e in self.early.items() if e[0] >= self.lease_until}
        if revoked:  # inputs waiting for their orders may be a new leg's: they expire as usual
            given_up = revoked_legs(self.legs.values(), self.revoked_epoch)
            self._lease_lapsed("revoked by the frontend", given_up)
        for leg in [leg for leg in self.legs.values() if leg.deadline < now]:
            self.io.fail(leg.seq_id, pb.FAILURE_DEADLINE, f"{self.instance}: deadline passed")
            self.finish(leg, reason="deadline passed")
        for seq_id in [s for s, (since, _) in self.early.items() if since < now - EARLY_KEEP_S]:
            del self.early[seq_id]

    def _lease_lapsed(self, how: str, legs: list[Leg]) -> None:
        """The frontend cannot hear this worker, or this worker the frontend: its requests are
        carried on elsewhere or have failed, so their legs here are dropped and their blocks freed
        (what a partition leaves behind must not hold memory until the legs' deadlines)."""
        if not legs:
            return
        self.lease_lapses += 1
        why = f"{self.instance}: the frontend's lease lapsed ({how})"
        print(f"{why}: dropping {len(legs)} legs", flush=True)
        for leg in legs:
            self.io.fail(leg.seq_id, pb.FAILURE_LEASE_LAPSED, why)
            self.finish(leg, reason=why)

    def status(self) -> pb.WorkerStatus:
        """A snapshot, taken on the loop thread (RPC threads answer with the last one)."""
        alloc = self.engine.allocator
        digest = 0
        cached = list(cached_hashes(self.engine.radix, self.engine.tiers))
        for h in cached:
            digest ^= h
        return pb.WorkerStatus(
            instance=self.instance,
            ready=True,
            running=self.running(),
            waiting=len(self.legs) - self.running(),
            kv_blocks_used=alloc.num_blocks - alloc.num_free,
            kv_blocks_total=alloc.num_blocks,
            cached_blocks=len(cached),
            cache_digest=digest,
            legs=list(self.legs),
            kv_bytes_per_token=self.engine.block_bytes // self.engine.block_size,
            tiers=tier_stats(self.engine),
            lease_lapses=self.lease_lapses,
        )

    def running(self) -> int:
        """Legs in a decode batch (none on a worker that does not decode)."""
        return 0

    def retell(self) -> None:
        """A report stream broke and reopened: the reports it had taken may be lost. Every live
        leg whose tokens go that way tells its output again, and so does every leg that ended in
        the last RETELL_S (the stream's reader merges by position: a token told twice is one)."""
        reopened = self.io.reopened()
        if not reopened:
            return
        for leg in list(self.legs.values()):
            if leg.order.reply_to in reopened and leg.seq is not None and leg.seq.output_ids:
                self.io.tokens(self._run(leg), leg.order.reply_to)
        for to, tokens in self.ended.retold(reopened):
            self.io.tokens(tokens, to)

    def publish(self) -> None:
        self.retell()
        self.io.flush()  # the step's tokens, in one report
        if self.op.caches_prefixes:  # the router mirrors every cache it can route on
            radix, tiers = self.engine.radix, self.engine.tiers
            if self.io.resync.is_set():  # the report stream reconnected and may have lost a delta
                self.io.resync.clear()
                cache_changes(radix, tiers)
                self.io.report(cache=delta(cache_listing(radix, tiers), [], [], full=True))
            else:
                inserted, evicted, moved = cache_changes(radix, tiers)  # O(change), not a diff
                if inserted or evicted or moved:
                    self.io.report(cache=delta(inserted, evicted, moved))
        if time.monotonic() - self._last_status > STATUS_EVERY_S:
            self._last_status = time.monotonic()
            self._status = self.status()
            self.io.report(status=self._status)

    def close(self) -> None:
        self.stopping.set()
        self.rpc.stop(grace=0.5)
        self.io.close()
        self.engine.close()  # its follower ranks stop too
