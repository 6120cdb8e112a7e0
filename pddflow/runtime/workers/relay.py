"""RelayDecode: decode as soon as the KV lands (eager tokens), and when main says its KV has landed
(over the token_ids channel the two share), hand main the generated token IDs: one-shot (all at
once, then stop) or catch-up (batches while decoding, stop when main has caught up), split by
`core/handoff_batches.py`; an adaptive handoff's mode is decided then, from this relay's load."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pddflow.core.channel_kinds import Kind
from pddflow.core.handoff_batches import HandoffBatches, HandoffStep
from pddflow.core.payloads import TokenIds
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.workers.decoder import DecodeLeg, DecoderWorker
from pddflow.runtime.workers.inbox import (
    CaughtUp,
    HandoffDelivered,
    HandoffUndeliverable,
    InboxItem,
    MainLanded,
)
from pddflow.runtime.workers.loop import hands_off
from pddflow.runtime.workers.registry import runs
from pddflow.scheduler.features import InstanceLoad


@dataclass(eq=False)
class RelayLeg(DecodeLeg):
    handing_off: pb.HandoffMode.ValueType = pb.HANDOFF_NONE
    pending_handoff: pb.HandoffMode.ValueType = pb.HANDOFF_NONE  # asked before decoding began
    sent_upto: int = 0  # output tokens already handed to main
    main_waiting: bool = False  # main has extended every ID sent (so far)


@runs("relay_decode")
class RelayWorker(DecoderWorker):
    leg_type = RelayLeg
    relays = True

    def on_order(self, leg: RelayLeg) -> None:
        super().on_order(leg)
        if hands_off(leg.order):
            self.io.open_handoff(leg.order.main)  # main speaks first: its KV has landed

    def on_input(self, leg: RelayLeg, item: InboxItem) -> None:
        if isinstance(item, MainLanded):
            self.start_handoff(leg, self.opening_mode(leg))
        elif isinstance(item, CaughtUp):
            leg.main_waiting = True
            if leg.handing_off and leg.decoding:
                self.advance(leg)
        elif isinstance(item, HandoffDelivered):
            self.finish(leg, reason="handed off")
        elif isinstance(item, HandoffUndeliverable):
            self.keep_decoding(leg)
        else:
            super().on_input(leg, item)

    def started(self, leg: RelayLeg) -> None:
        if leg.pending_handoff:
            self.start_handoff(leg, leg.pending_handoff)

    def after_token(self, leg: RelayLeg) -> None:
        if leg.handing_off and leg.decoding and not leg.seq.finished:
            self.advance(leg)

    def on_finished(self, leg: RelayLeg) -> None:
        """Finished before handing off: main still gets every ID, so its radix cache stays aligned
        with prefill's (both PDD pipelines end at main)."""
        if leg.order.main and not leg.order.singular:
            try:
                self.send_ids(leg, final=True)
            except Exception as exc:  # noqa: BLE001 - the request is done; main misses a turn
                self.io.fail(leg.seq_id, pb.FAILURE_HANDOFF, str(exc))

    def load(self) -> float:
        """This relay's load now, as the router's scheduler reads it from a status (and the
        simulator from its engine)."""
        alloc, running = self.engine.allocator, self.running()
        used = (alloc.num_blocks - alloc.num_free) / max(alloc.num_blocks, 1)
        return InstanceLoad(running, len(self.legs) - running, self.op.max_batch, used).load

    def opening_mode(self, leg: RelayLeg) -> pb.HandoffMode.ValueType:
        """The handoff's mode as main's KV lands: as ordered, or for an adaptive handoff the
        policy's rule on this relay's load now (busy: one-shot, sheds the request at once)."""
        order, load = leg.order, self.load()
        mode = order.handoff
        if order.catch_up_load:
            busy = HandoffBatches(catch_up_load=order.catch_up_load).busy(load)
            mode = pb.HANDOFF_ONE_SHOT if busy else pb.HANDOFF_CATCH_UP
        adaptive = float(order.catch_up_load > 0)
        self.io.event(
            leg.seq_id, pb.EVENT_HANDOFF_STARTED, mode=float(mode), adaptive=adaptive, load=load
        )
        return mode

    def start_handoff(self, leg: RelayLeg, mode: pb.HandoffMode.ValueType) -> None:
        if not leg.decoding:  # main's KV landed before the relay's: hand over once it decodes
            leg.pending_handoff = mode
            return
        leg.handing_off, leg.main_waiting = mode, True
        self.advance(leg)

    def advance(self, leg: RelayLeg) -> None:
        """Send what the batching says now; the rest waits for the next token or main's CaughtUp."""
        order = leg.order
        batches = HandoffBatches(
            order.catch_up_tokens, order.min_extend_tokens, order.catch_up_load
        )
        mode = "one_shot" if leg.handing_off == pb.HANDOFF_ONE_SHOT else "catch_up"
        load = self.load()
        unsent = len(leg.seq.output_ids) - leg.sent_upto
        step = batches.step(
            mode, unsent, finished=False, main_waiting=leg.main_waiting, relay_load=load
        )
        if step is HandoffStep.WAIT:
            return
        try:
            if step is HandoffStep.FINAL:
                leg.decoding = False
                switched = batches.switched(
                    mode, unsent, main_waiting=leg.main_waiting, relay_load=load
                )
                self.send_ids(leg, final=True, switched=switched)
            else:
                leg.main_waiting = False
                self.send_ids(leg, final=False)
        except Exception as exc:  # noqa: BLE001 - main unreachable: the relay keeps decoding
            self.keep_decoding(leg)
            self.io.fail(leg.seq_id, pb.FAILURE_HANDOFF, str(exc))

    def keep_decoding(self, leg: RelayLeg) -> None:
        leg.handing_off, leg.decoding = pb.HANDOFF_NONE, not leg.seq.finished

    def send_ids(self, leg: RelayLeg, final: bool, switched: bool = False) -> None:
        if leg.seq.finished and not final:
            return
        ids = leg.seq.output_ids[leg.sent_upto :]
        msg = TokenIds(leg.seq_id, leg.sent_upto, list(ids), final=final)
        leg.sent_upto += len(ids)
        main = self.io.sender(Kind.TOKEN_IDS, leg.order.main)
        fut = main.send_async(msg, timeout_s=max(0.1, leg.deadline - time.monotonic()))
        kind = pb.EVENT_HANDOFF_SENT if final else pb.EVENT_CATCH_UP_SENT
        extra = {"switched": 1.0} if switched else {}
        self.io.event(leg.seq_id, kind, tokens=len(ids), start=msg.start, **extra)
        if final:
            fut.add_done_callback(lambda f, seq_id=leg.seq_id: self._delivered(seq_id, f))

    def _delivered(self, seq_id: str, fut: Any) -> None:
        """On a channel thread: the final batch reached main, or main is gone (declared fallback:
        the relay finishes the request itself)."""
        if fut.exception() is None:
            self.inbox.put(HandoffDelivered(seq_id))
        else:
            self.io.fail(seq_id, pb.FAILURE_HANDOFF, str(fut.exception()))
            self.inbox.put(HandoffUndeliverable(seq_id))
