"""What every decoding role shares: KV landing under memory admission (all blocks allocated at
once, so no decode step runs dry), the decode step from prefill's first token (which came with
the KV), a local prefill for a resumed request."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pddflow.core.kv_budget import kv_fit
from pddflow.core.payloads import FirstToken, KVBlocks
from pddflow.operators.block_allocator import KVCacheFull
from pddflow.operators.engine_core import KVShardMissing
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.workers.inbox import InboxItem, KVArrived, KVLost
from pddflow.runtime.workers.loop import Leg, Worker, first_token
from pddflow.runtime.workers.registry import runs


@dataclass(eq=False)
class DecodeLeg(Leg):
    kv: KVBlocks | None = None  # landed, not yet imported
    kv_arrived: float = 0.0  # when that KV reached this process
    kv_pieces: int = 1  # rank-to-rank: the sending ranks' pieces it was joined from
    kv_ready: bool = False  # the prompt's KV is in this worker's cache
    first: FirstToken | None = None  # prefill's first token (with the KV), or this worker's
    decoding: bool = False
    kv_lost: str = ""  # why the KV will not come: recompute it once memory has room


@dataclass
class DecodeStats:
    steps: int = 0
    cpu_s: float = 0.0  # the loop thread's
    seqs: int = 0
    context_tokens: int = 0
    wall_s: float = 0.0  # of the loop iterations that ran them


class DecoderWorker(Worker):
    leg_type = DecodeLeg
    prefills = True  # a resumed leg's prompt and output so far, locally (local_prefill)
    decodes = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.memory_wait: list[DecodeLeg] = []  # landed KV waiting for room, FIFO
        self.shard_wait: list[DecodeLeg] = []  # rank-to-rank KV a follower rank still lacks
        self.stats = DecodeStats()
        self._decoded = False  # this iteration ran a decode step

    def on_order(self, leg: DecodeLeg) -> None:
        if leg.order.local_prefill:
            self.compute_queue.append(leg)

    def on_input(self, leg: DecodeLeg, item: InboxItem) -> None:
        if isinstance(item, KVArrived):
            leg.kv, leg.kv_arrived, leg.kv_pieces = item.kv, item.arrived, item.pieces
            leg.first = leg.first or item.kv.first
            self.land(leg)
        elif isinstance(item, KVLost):
            self.recompute_kv(leg, item.reason)

    def idle(self) -> bool:
        return not (self.compute_queue or self.decoding())

    def wait_s(self) -> float:
        return 0.002 if self.shard_wait else super().wait_s()

    def step(self) -> None:
        self.land_waiting()
        for leg in list(self.shard_wait):
            self.shard_wait.remove(leg)
            if leg.seq_id in self.legs and leg.kv is not None:
                self.land(leg)
        if self.compute_queue:
            self.compute(self.compute_queue.pop(0))
        elif batch := self.decoding()[: self.op.max_batch]:
            self.decode(batch)
            self._decoded = True

    def iterated(self, wall_s: float) -> None:
        if self._decoded:  # the step and the loop's own work around it (reports, landing, status)
            self.stats.wall_s += wall_s
            self._decoded = False

    def decoding(self) -> list[DecodeLeg]:
        return [leg for leg in self.legs.values() if leg.decoding]

    def running(self) -> int:
        return len(self.decoding())

    def compute(self, leg: DecodeLeg) -> None:
        """A local prefill (a colocated request, or one resumed here), once its memory fits."""
        if not self.room_for(leg):
            return
        try:
            reused = self.engine.reuse_prefix(leg.seq)
            self.engine.prefill(leg.seq)
            self.engine.reserve(leg.seq, self.total_tokens(leg))
            self.emit_last(leg, reused)
            leg.kv_ready = True
            leg.decoding = not leg.seq.finished
            if leg.seq.finished:
                self.finish(leg)
        except Exception as exc:  # noqa: BLE001 - one request's failure must not stop the worker
            self.fail(leg, pb.FAILURE_COMPUTE, exc)

    def decode(self, batch: list[DecodeLeg]) -> None:
        seqs = [leg.seq for leg in batch]
        c0 = time.thread_time()
        try:
            self.engine.decode(seqs)
        except Exception as exc:  # noqa: BLE001
            for leg in batch:
                self.fail(leg, pb.FAILURE_COMPUTE, exc)
            return
        self.decoded(batch, c0)

    def decoded(self, batch: list[DecodeLeg], c0: float) -> None:
        """A decode step gave every leg of `batch` a token (its thread CPU clock began at c0)."""
        st = self.stats
        st.steps += 1
        st.cpu_s += time.thread_time() - c0
        st.seqs += len(batch)
        st.context_tokens += sum(leg.seq.num_computed - 1 for leg in batch)
        for leg in batch:
            self.emit_last(leg)
            self.after_token(leg)
            if leg.seq.finished:
                self.on_finished(leg)
                self.finish(leg)

    def after_token(self, leg: DecodeLeg) -> None:
        """A decode step gave `leg` a token (the relay hands catch-up batches over here)."""

    def on_finished(self, leg: DecodeLeg) -> None:
        """`leg` emitted its last token; the leg ends after this."""

    def landed(self, leg: DecodeLeg) -> None:
        """The prompt's KV from prefill is in this worker's cache (a hook: main tells the relay)."""

    def before_landing(self, leg: DecodeLeg) -> None:
        """The leg's room is there and its KV (or its recompute) goes in next (MainWorker: the
        cached prefix blocks held below the device come up first)."""

    def land(self, leg: DecodeLeg) -> None:
        if not self.room_for(leg):
            return
        waited_ms = (time.monotonic() - leg.kv_arrived) * 1e3
        try:
            self.before_landing(leg)
            self.engine.import_kv(leg.seq, leg.kv)
        except KVShardMissing as exc:  # a rank's heads are late, or lost on their way
            if time.monotonic() - leg.kv_arrived < self.shards.ttl_s / 2:
                self.shard_wait.append(leg)  # the next iterations try again
                return
            leg.kv = None
            self.recompute_kv(leg, f"KV incomplete past the channel's deadline: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - a bad transfer: recompute from token IDs
            leg.kv = None
            self.recompute_kv(leg, f"cannot import KV: {exc}")
            return
        self.engine.reserve(leg.seq, self.total_tokens(leg))  # room_for said it fits
        nbytes = float(leg.kv.data.nbytes)
        # every rank landed the heads its own receiver got (rank to rank), or the leader all
        own = float(leg.kv.heads is not None)
        leg.kv, leg.kv_ready = None, True
        # waited_ms: the KV had reached this process; the loop took it later (a step in progress,
        # a shared core, no room in memory)
        values = {"waited_ms": waited_ms, "bytes": nbytes, "pieces": float(leg.kv_pieces)}
        self.io.event(leg.seq_id, pb.EVENT_KV_LANDED, ranks_own_heads=own, **values)
        self.landed(leg)
        self.maybe_start(leg)

    @staticmethod
    def total_tokens(leg: DecodeLeg) -> int:
        return leg.seq.num_prompt_tokens + leg.seq.sampling.max_tokens

    def room_for(self, leg: DecodeLeg) -> bool:
        """Whether the request's prompt and whole output fit now; if not, it waits in line (a
        request that could never fit fails now, saying so)."""
        alloc, seq = self.engine.allocator, leg.seq
        held = len(seq.block_table)
        fit = kv_fit(
            seq.num_prompt_tokens, seq.sampling.max_tokens, self.engine.block_size, alloc.num_blocks
        )
        need = max(0, fit.blocks - held)
        if not fit.fits:
            what = f"{leg.seq_id} (its prompt and max_tokens)"
            full = KVCacheFull(
                need, alloc.num_free, alloc.num_blocks, self.engine.block_bytes, what
            )
            self.fail(leg, pb.FAILURE_COMPUTE, full)
            return False
        if not self.memory_wait or self.memory_wait[0] is leg:
            # the radix walk (O(cache size)) only when the free blocks are not enough
            fits = need <= alloc.num_free
            if not fits and self.op.caches_prefixes:
                fits = need <= alloc.num_free + self.engine.radix.evictable_count()
            if fits:
                if self.memory_wait:
                    self.memory_wait.pop(0)
                return True
        if leg not in self.memory_wait:
            self.memory_wait.append(leg)
            self.io.event(leg.seq_id, pb.EVENT_KV_WAITS_FOR_MEMORY, blocks=need)
        return False

    def land_waiting(self) -> None:
        while self.memory_wait:
            leg = self.memory_wait[0]
            if leg.seq_id not in self.legs:  # ended while it waited
                self.memory_wait.pop(0)
                continue
            if leg.kv is not None:
                self.land(leg)
            elif leg.kv_lost:
                self.recompute_kv(leg, leg.kv_lost)
            else:
                self.compute(leg)
            if self.memory_wait and self.memory_wait[0] is leg:
                return

    def recompute_kv(self, leg: DecodeLeg, error: str) -> None:
        """The KV will not come: recompute the prompt from its token IDs (declared fallback)."""
        if leg.kv_ready or leg.kv is not None:  # (KV that arrived and waits for memory lands)
            return
        if not self.room_for(leg):
            leg.kv_lost = error
            return
        try:
            self.before_landing(leg)
            if leg.first is None and self.starts_alone(leg):
                # the first token was to come with the KV: sample it here, as prefill would have
                reused = leg.seq.num_computed
                self.engine.prefill(leg.seq)
                leg.first = first_token(leg.seq, reused)
            else:
                self.engine.compute_to(leg.seq, leg.seq.num_prompt_tokens)
            self.engine.reserve(leg.seq, self.total_tokens(leg))
        except Exception as exc:  # noqa: BLE001
            self.fail(leg, pb.FAILURE_COMPUTE, exc)
            return
        leg.kv, leg.kv_ready = None, True
        self.io.event(leg.seq_id, pb.EVENT_KV_RECOMPUTED)
        self.io.fail(leg.seq_id, pb.FAILURE_KV_RECOVERED, error)
        self.maybe_start(leg)

    def maybe_start(self, leg: DecodeLeg) -> None:
        """Decode from the first token once the KV is here (the token came with it)."""
        first = leg.first
        if not leg.kv_ready or leg.decoding or first is None or not self.starts_alone(leg):
            return
        seq = leg.seq
        if len(seq.token_ids) == seq.num_prompt_tokens:  # prefill's (one sampled here is in)
            self.engine.append_tokens(seq, [first.token])
        # the client sees it once a decoder holds the KV, with prefill's log probability
        lps = [first.logprob] if first.logprob is not None else None
        self.emit(leg, [first.token], start=0, lps=lps, cached_tokens=first.cached_tokens)
        if seq.finished:  # the token this worker sampled ended it (recomputed KV)
            self.on_finished(leg)
            self.finish(leg)
            return
        leg.decoding = True
        self.started(leg)

    def starts_alone(self, leg: DecodeLeg) -> bool:
        """False where the request continues from a relay's handoff instead."""
        return True

    def started(self, leg: DecodeLeg) -> None:
        """`leg` has begun decoding (a hook)."""

    def finish(self, leg: DecodeLeg, reason: str = "") -> None:
        if leg in self.memory_wait:
            self.memory_wait.remove(leg)
        if leg in self.shard_wait:
            self.shard_wait.remove(leg)
        if not leg.kv_ready and reason:
            for receiver in self.io.kv_receivers:
                receiver.cancel(leg.seq_id, reason)
        super().finish(leg, reason)

    def status(self) -> pb.WorkerStatus:
        status = super().status()
        st = self.stats
        status.decode_steps, status.decode_cpu_s, status.decode_wall_s = (
            st.steps,
            st.cpu_s,
            st.wall_s,
        )
        status.decode_seqs, status.decode_context_tokens = st.seqs, st.context_tokens
        return status


@runs("colocated")
class ColocatedWorker(DecoderWorker):
    """Prefill and decode on one instance: every order is a local prefill."""

    def on_order(self, leg: DecodeLeg) -> None:
        self.compute_queue.append(leg)
