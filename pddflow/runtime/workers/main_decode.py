"""MainDecode (and plain PD decode): adopt the cached prefix the router counted on, import the rest
of the prompt's KV, then either decode from prefill's first token (P-MD) or tell the relay the KV
has landed, extend over the token IDs it hands over and decode to the end (P-RLD-MD)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pddflow.core.kv_reuse import reused_blocks
from pddflow.core.payloads import TokenIds
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.workers.cache_report import load_event
from pddflow.runtime.workers.decoder import DecodeLeg, DecoderWorker
from pddflow.runtime.workers.inbox import HandoffTokens, InboxItem
from pddflow.runtime.workers.loop import hands_off
from pddflow.runtime.workers.registry import runs


@dataclass(eq=False)
class MainLeg(DecodeLeg):
    handoff: list[TokenIds] = field(default_factory=list)  # the relay's IDs, not yet extended
    relay: str = ""  # the relay instance that sends them
    lower_blocks: int = 0  # its cached prefix reaches below the device: loaded when its KV lands


@runs("main_decode", "decode")
class MainWorker(DecoderWorker):
    leg_type = MainLeg
    takes_handoff = True

    def on_order(self, leg: MainLeg) -> None:
        if leg.order.local_prefill:
            self.compute_queue.append(leg)
        else:
            self.adopt_prefix(leg)

    def on_input(self, leg: MainLeg, item: InboxItem) -> None:
        if isinstance(item, HandoffTokens):
            leg.relay = item.peer
            leg.handoff.append(item.ids)
            if leg in self.memory_wait and self._done_by_relay(leg):
                self._skip_turn(leg)
                return
            if leg.kv_ready and leg not in self.compute_queue:
                self.compute_queue.append(leg)
        else:
            super().on_input(leg, item)

    def adopt_prefix(self, leg: MainLeg) -> None:
        """Take exactly the cached prefix blocks the router counted on (prefill sends the rest):
        the device cache's now, a tier's below it when the KV lands (`before_landing`); blocks
        evicted from every tier since the decision are recomputed from the prompt's token IDs."""
        seq, bs = leg.seq, self.engine.block_size
        blocks = reused_blocks(leg.order.main_cached_blocks, seq.num_prompt_tokens, bs)
        if blocks == 0:
            return
        self.engine.adopt_cached(seq, blocks, lower=False)
        if self.engine.tiers is not None and seq.num_computed < blocks * bs:
            # the rest is below the device: loaded once the KV has landed and has its room, so
            # that no device memory is held while the copy crosses the WAN
            leg.lower_blocks = blocks
            return
        self._recompute_missing(leg, blocks)

    def landed(self, leg: MainLeg) -> None:
        """P-RLD-MD: the relay hands over once it hears this, straight from main (the token_ids
        channel the two share; no hop through the frontend)."""
        if hands_off(leg.order):
            timeout = max(0.1, leg.deadline - time.monotonic())
            self.io.landed(leg.order.relay, leg.seq_id, timeout_s=timeout)

    def before_landing(self, leg: MainLeg) -> None:
        if not leg.lower_blocks:
            return
        blocks, leg.lower_blocks = leg.lower_blocks, 0
        load = self.engine.load_lower(leg.seq, blocks)
        if load.total:
            self.io.event(leg.seq_id, pb.EVENT_CACHE_TIER_LOADED, **load_event(load))
        self._recompute_missing(leg, blocks)

    def _recompute_missing(self, leg: MainLeg, blocks: int) -> None:
        seq, bs = leg.seq, self.engine.block_size
        have = seq.num_computed // bs
        if have < blocks:
            self.engine.compute_to(seq, blocks * bs)
            self.io.event(leg.seq_id, pb.EVENT_CACHE_MISS_RECOMPUTED, blocks=blocks - have)

    def room_for(self, leg: MainLeg) -> bool:
        if super().room_for(leg):
            return True
        if leg.seq_id in self.legs and self._done_by_relay(leg):
            self._skip_turn(leg)
        return False

    @staticmethod
    def _done_by_relay(leg: MainLeg) -> bool:
        """The relay's final IDs end the request: main would only keep its cache in step."""
        if not leg.handoff or not leg.handoff[-1].final or not leg.handoff[-1].ids:
            return False
        last, sampling = leg.handoff[-1], leg.seq.sampling
        end = last.start + len(last.ids)
        return end >= sampling.max_tokens or last.ids[-1] in sampling.stop_token_ids

    def _skip_turn(self, leg: MainLeg) -> None:
        """Waiting for memory would keep the turn's cached prefix pinned (until the frontend's
        orphan sweep, 65 s) while turns that still need main wait behind it: the cache does
        without this turn, and the router's mirror says so."""
        self.io.event(leg.seq_id, pb.EVENT_TURN_NOT_CACHED, blocks=len(leg.seq.block_table))
        if leg in self.memory_wait:
            self.memory_wait.remove(leg)
        self.finish(leg, reason="the relay finished it; no memory to cache it")

    def maybe_start(self, leg: MainLeg) -> None:
        if leg.kv_ready and not leg.decoding and leg.handoff:
            if leg not in self.compute_queue:
                self.compute_queue.append(leg)
        else:
            super().maybe_start(leg)

    def starts_alone(self, leg: MainLeg) -> bool:
        return not leg.order.relay or leg.order.singular

    def step(self) -> None:
        """Handoff extends that fit ride along with the decode batch in one forward (a catch-up
        batch costs main no step of its own); anything else as the decoder's loop does it."""
        batch = self.decoding()[: self.op.max_batch]
        extends = self._mixable(len(batch)) if batch else []
        if not extends:
            super().step()
            return
        self.land_waiting()
        for leg in extends:
            self.compute_queue.remove(leg)
        handoffs = [self._take_batch(leg) for leg in extends]
        c0 = time.thread_time()
        try:
            logits, _ = self.engine.extend_and_decode(
                [(leg.seq, ids.ids) for leg, ids in zip(extends, handoffs, strict=True)],
                [leg.seq for leg in batch],
            )
        except Exception as exc:  # noqa: BLE001 - one step's failure fails its requests only
            for leg in extends + batch:
                self.fail(leg, pb.FAILURE_COMPUTE, exc)
            return
        for leg, ids, row in zip(extends, handoffs, logits, strict=True):
            self._extended(leg, ids, row, beside=len(batch))
        self.decoded(batch, c0)
        self._decoded = True

    def _mixable(self, decoding: int) -> list[MainLeg]:
        """Legs whose next handoff batch fits in this step beside `decoding` sequences."""
        room = self.engine.max_step_tokens - decoding
        out = []
        for leg in self.compute_queue:
            if not (leg.handoff and leg.kv_ready and not leg.decoding):
                continue
            n = len(leg.handoff[0].ids)
            if 0 < n <= min(room, self.engine.config.chunk_size):
                out.append(leg)
                room -= n
        return out

    def compute(self, leg: MainLeg) -> None:
        if not leg.handoff:
            super().compute(leg)  # a local prefill
            return
        try:
            batch = self._take_batch(leg)
            self._extended(leg, batch, self.engine.extend(leg.seq, batch.ids))
        except Exception as exc:  # noqa: BLE001 - one request's failure must not stop the worker
            self.fail(leg, pb.FAILURE_COMPUTE, exc)

    def _take_batch(self, leg: MainLeg) -> TokenIds:
        batch, seq = leg.handoff.pop(0), leg.seq
        if batch.start != len(seq.output_ids):
            raise RuntimeError(
                f"handoff for {leg.seq_id} starts at {batch.start}, expected {len(seq.output_ids)}"
            )
        return batch

    def _extended(self, leg: MainLeg, batch: TokenIds, logits, beside: int = 0) -> None:
        """Main has extended over one batch of the relay's IDs (in a step with `beside` decoding
        sequences); after the final one, sample and decode."""
        seq = leg.seq
        final = float(batch.final)
        self.io.event(
            leg.seq_id,
            pb.EVENT_EXTEND_DONE,
            tokens=len(batch.ids),
            final=final,
            decoded_beside=float(beside),
        )
        if batch.final and self._complete(seq):  # the relay finished it: keep the KV, emit nothing
            self.finish(leg)
        elif batch.final:
            self.engine.sample(seq, logits)
            self.emit_last(leg)
            if seq.finished:
                self.finish(leg)
            else:
                leg.decoding = True
        elif leg.handoff:  # the relay's next batch came meanwhile
            self.compute_queue.append(leg)
        else:
            timeout = max(0.1, leg.deadline - time.monotonic())
            self.io.release(leg.relay, leg.seq_id, timeout_s=timeout)

    @staticmethod
    def _complete(seq) -> bool:
        out, stops = seq.output_ids, seq.sampling.stop_token_ids
        return len(out) >= seq.sampling.max_tokens or (bool(out) and out[-1] in stops)
