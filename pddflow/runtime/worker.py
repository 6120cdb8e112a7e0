"""A worker process: one operator instance of a deployment, running an Engine.

    python -m pddflow.runtime.worker WIRING.json INSTANCE

Its loop reads on one screen: admit what arrived (jobs, landed KV, first tokens, handoff IDs,
aborts), run one model step (a prefill, an extend, or one continuous-batching decode step), report.
A decoder takes landed KV only when the request's prompt and whole output fit in its free blocks
plus what the prefix cache can give back, and then allocates them all at once, so no decode step
can run out of blocks; otherwise the KV waits, first come first served, under the request's
deadline.
What a request does on this worker depends on the operator type (see the `_on_*` methods):

  prefill       prefill, report the first token, ship KV to the relay (RDMA) and to main (WAN,
                only the blocks main's radix cache lacks), free.
  relay_decode  import the KV, decode eagerly, stream tokens; on the frontend's word hand the
                generated IDs to main: one-shot (all at once, then stop) or catch-up (batches
                while decoding, stop when main says it has caught up).
  main_decode   adopt cached prefix blocks, import the rest, then either decode from the first
  / decode      token (p_md) or extend over the relay's IDs and decode to the end (p_rld_md).
  colocated     prefill and decode here.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pddflow.core.cpu_layout import pin_self
from pddflow.core.payloads import KVBlocks, SamplingParams, TokenIds
from pddflow.operators.block_allocator import KVCacheFull
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.rpc import WORKER, serve
from pddflow.runtime.wiring import Wiring
from pddflow.runtime.worker_io import WorkerIO

STATUS_EVERY_S = 0.5
EARLY_KEEP_S = 60.0  # inputs that arrive before their job are kept this long


def reused_blocks(cached_blocks: int, prompt_tokens: int, block_size: int) -> int:
    """Prefix blocks main reuses from its cache; prefill sends the rest. Both ends compute it the
    same way, and at least the block holding the prompt's last token always travels (so main's
    KV arrival is one event, never an empty transfer)."""
    return min(cached_blocks, (prompt_tokens - 1) // block_size)


@dataclass(eq=False)
class Leg:
    """One request on this worker."""

    job: pb.Job
    deadline: float
    seq: Any = None  # engine Sequence
    kv: KVBlocks | None = None  # landed, not yet imported
    kv_at: float = 0.0  # when that KV reached this process
    kv_ready: bool = False  # the prompt KV is in this worker's cache
    first: int | None = None  # first generated token (from prefill, via the frontend)
    handoff: list[TokenIds] = field(
        default_factory=list
    )  # main: IDs from the relay, not yet extended
    handoff_from: str = ""  # main: the relay peer
    handing_off: str = ""  # relay: "" | one_shot | catch_up
    pending_handoff: str = ""  # relay: asked to hand off before it started decoding
    sent_upto: int = 0  # relay: output tokens already handed to main
    released: bool = False  # relay: main has caught up
    decoding: bool = False
    reported: int = 0  # output positions reported so far
    received: float = field(default_factory=time.monotonic)  # when the job arrived here
    compute_ms: tuple[float, float, float] = (
        0.0,
        0.0,
        0.0,
    )  # prefill: (queued, ran, its CPU) for its timeline
    cached_tokens: int = 0  # prefill: prompt tokens its prefix cache gave

    @property
    def seq_id(self) -> str:
        return self.job.seq_id


class Worker:
    def __init__(self, wiring: Wiring, instance: str):
        import torch

        from pddflow.operators.engine import Engine, EngineConfig

        if wiring.threads.get(instance):
            torch.set_num_threads(
                wiring.threads[instance]
            )  # this worker's share of the host's cores

        self.wiring, self.instance = wiring, instance
        self.plan = wiring.plan()
        self.inbox: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.io = WorkerIO(wiring, self.plan, instance, self.inbox)
        op = self.plan.operators[self.io.operator]
        self.op_type = op.op_type
        cache = bool(op.params.get("radix_cache", op.params.get("prefix_cache", False)))
        self.engine = Engine.from_spec(
            self.plan.model.weights,
            EngineConfig(
                block_size=self.plan.model.block_size,
                kv_cache_bytes=wiring.kv_cache_bytes,
                chunk_size=int(op.params.get("chunk_tokens", 512)),
                prefix_cache=cache,
            ),
        )
        self.max_batch = int(op.params.get("max_batch", 64))
        self.legs: dict[str, Leg] = {}
        self.early: dict[str, list[tuple[float, tuple]]] = {}
        self.compute_queue: list[Leg] = []  # prefills and extends, in arrival order
        self.memory_wait: list[Leg] = []  # decoders: landed KV waiting for room to finish, FIFO
        self.mirrored = cache  # the router mirrors every cache it can route on
        self._last_status = 0.0
        self._status = pb.WorkerStatus(instance=instance, ready=False)
        self.decode_totals = [
            0,
            0.0,
            0,
            0,
            0.0,
        ]  # steps, loop-thread CPU s, sequences, context tokens, wall s
        self.rpc, _ = serve(
            WORKER,
            {
                # a job carries when it reached this process: the loop reads its inbox between model
                # calls, and a prefill's queue time starts when the job arrived, not when it was read
                "Submit": (pb.Job, pb.Reply, lambda m: self._enqueue(("job", m, time.monotonic()))),
                "Feed": (
                    pb.Tokens,
                    pb.Reply,
                    lambda m: self._enqueue(("first", m.seq_id, m.ids[0])),
                ),
                "Handoff": (
                    pb.StartHandoff,
                    pb.Reply,
                    lambda m: self._enqueue(("start_handoff", m.seq_id, m.mode)),
                ),
                "Abort": (
                    pb.Cancel,
                    pb.Reply,
                    lambda m: self._enqueue(("abort", m.seq_id, m.reason)),
                ),
                "Recompute": (
                    pb.Cancel,
                    pb.Reply,
                    lambda m: self._enqueue(("kv_error", m.seq_id, m.reason)),
                ),
                "Status": (pb.Empty, pb.WorkerStatus, lambda _: self._status),
            },
            port=int(wiring.workers[instance].rpc.rsplit(":", 1)[1]),
        )

    def _enqueue(self, item: tuple) -> pb.Reply:
        self.inbox.put(item)
        return pb.Reply(ok=True)

    # ---- the loop --------------------------------------------------------------------------
    def run(self) -> None:
        self._status = self.status()
        self.io.report(status=self._status)
        while not self.stopping.is_set():
            try:
                t0 = time.monotonic()
                idle = not (self.compute_queue or self._decoding())
                self.admit(block=idle)
                if idle:  # an idle wait for work is nobody's step
                    t0 = time.monotonic()
                self._land_waiting()
                decoded = False
                if self.compute_queue:
                    self.compute(self.compute_queue.pop(0))
                elif batch := self._decoding()[: self.max_batch]:
                    self.decode(batch)
                    decoded = True
                self.expire()
                self.publish()
                if decoded:  # the iteration's wall, for the simulator's calibration
                    self.decode_totals[4] += time.monotonic() - t0
            except Exception:  # noqa: BLE001 - a bug in one request's handling must not take the worker down
                traceback.print_exc()

    def admit(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.05) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self.handle(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _decoding(self) -> list[Leg]:
        return [leg for leg in self.legs.values() if leg.decoding]

    # ---- inputs ------------------------------------------------------------------------------
    def handle(self, item: tuple) -> None:
        kind = item[0]
        if kind == "job":
            self._on_job(item[1], item[2])
            return
        seq_id = (
            item[1].seq_id
            if kind == "kv"
            else (item[2].seq_id if kind == "handoff_tokens" else item[1])
        )
        leg = self.legs.get(seq_id)
        if kind == "abort":
            if leg is not None:
                self.finish(leg, reason=item[2])
            else:
                self.early.setdefault(seq_id, []).append((time.monotonic(), item))
            return
        if leg is None:  # arrived before its job: keep it a while
            self.early.setdefault(seq_id, []).append((time.monotonic(), item))
            return
        if kind == "kv":
            leg.kv, leg.kv_at = item[1], item[2]
            self._land(leg)
        elif kind == "kv_error":
            self._kv_failed(leg, item[2])
        elif kind == "first":
            leg.first = int(item[2])
            self._maybe_start(leg)
        elif kind == "handoff_tokens":
            leg.handoff_from = item[1]
            leg.handoff.append(item[2])
            if leg.kv_ready and leg not in self.compute_queue:
                self.compute_queue.append(leg)
        elif kind == "start_handoff":
            self._start_handoff(leg, item[2])
        elif kind == "release":
            leg.released = True
            self._finish_catch_up(leg)
        elif kind == "keep_decoding":
            leg.handing_off, leg.decoding = "", not leg.seq.finished

    def _on_job(self, job: pb.Job, received: float) -> None:
        s = job.sampling
        sampling = SamplingParams(
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            seed=s.seed,
            stop_token_ids=tuple(s.stop_token_ids),
        )
        leg = Leg(job, received + (job.timeout_s or self.wiring.leg_timeout_s), received=received)
        try:
            leg.seq = self.engine.add_sequence(list(job.prompt_ids), sampling, job.seq_id)
        except ValueError as exc:
            self.io.report(failure=pb.Failure(seq_id=job.seq_id, leg="compute", error=str(exc)))
            return
        self.legs[job.seq_id] = leg
        if self.op_type in ("prefill", "colocated") or job.local_prefill:
            self.compute_queue.append(leg)
        elif self.op_type in ("main_decode", "decode"):
            self._adopt_prefix(leg, job.main_cached_blocks)
        for _, item in self.early.pop(job.seq_id, []):
            self.handle(item)

    # ---- compute -----------------------------------------------------------------------------
    def compute(self, leg: Leg) -> None:
        """One prefill (P, colocated, a relay resuming) or one handoff extend (main)."""
        try:
            if leg.handoff:
                self._extend(leg)
                return
            leg.cached_tokens = self.engine.reuse_prefix(
                leg.seq
            )  # (prefill would; the report says how many)
            t0, c0 = time.monotonic(), time.thread_time()
            first = self.engine.prefill(leg.seq)
            # wall and CPU time apart: a prefill that waited for its core shows wall >> CPU
            leg.compute_ms = (
                (t0 - leg.received) * 1e3,
                (time.monotonic() - t0) * 1e3,
                (time.thread_time() - c0) * 1e3,
            )
            self._emit(leg, [first], start=len(leg.seq.output_ids) - 1 + leg.job.output_offset)
            if self.op_type == "prefill":
                self._ship_kv(leg)
                self.finish(leg)
            elif not leg.seq.finished:
                leg.decoding = True
        except Exception as exc:  # noqa: BLE001 - one request's failure must not stop the worker
            self._fail(leg, "compute", exc)

    def decode(self, batch: list[Leg]) -> None:
        seqs = [leg.seq for leg in batch]
        context = sum(s.num_computed for s in seqs)
        c0 = time.thread_time()
        try:
            toks = self.engine.decode(seqs)
        except Exception as exc:  # noqa: BLE001
            for leg in batch:
                self._fail(leg, "compute", exc)
            return
        t = self.decode_totals
        t[0], t[1], t[2], t[3] = (
            t[0] + 1,
            t[1] + time.thread_time() - c0,
            t[2] + len(seqs),
            t[3] + context,
        )
        for leg, tok in zip(batch, toks):
            self._emit(leg, [tok], start=len(leg.seq.output_ids) - 1 + leg.job.output_offset)
            if leg.handing_off == "catch_up" and not leg.released:
                self._send_catch_up(leg, final=False)
            if leg.seq.finished:
                if self._owes_main(leg):  # main still takes the IDs, so its cache keeps this turn
                    try:
                        self._send_handoff(leg, final=True)
                    except Exception as exc:  # noqa: BLE001 - the request is done; main just misses a turn
                        self.io.report(
                            failure=pb.Failure(seq_id=leg.seq_id, leg="handoff", error=str(exc))
                        )
                self.finish(leg)

    def _emit(self, leg: Leg, ids: list[int], start: int) -> None:
        final = leg.seq.finished
        self.io.report(
            tokens=pb.Tokens(
                seq_id=leg.seq_id,
                start=start,
                ids=ids,
                final=final,
                finish_reason=leg.seq.finish_reason or "",
            )
        )
        leg.reported = start + len(ids)

    # ---- prefill: dual-path KV ---------------------------------------------------------------
    def _ship_kv(self, leg: Leg) -> None:
        job, seq = leg.job, leg.seq
        if seq.finished:
            return  # the first token ended it: nobody needs the KV
        targets = []
        if job.relay:
            targets.append((job.relay, 0))
        if job.main and not job.singular:
            targets.append(
                (
                    job.main,
                    reused_blocks(
                        job.main_cached_blocks, seq.num_prompt_tokens, self.engine.block_size
                    ),
                )
            )
        for dst, start_block in targets:
            kind = self.io.kv_kind_to(dst)
            timeout = max(0.1, min(leg.deadline - time.monotonic(), self.io.deadline_s(kind, dst)))
            t0, c0 = time.monotonic(), time.thread_time()
            kv = self.engine.export_kv(seq, start_block=start_block)
            export = ((time.monotonic() - t0) * 1e3, (time.thread_time() - c0) * 1e3)
            nbytes = kv.num_blocks * self.engine.block_bytes
            self.io.report(
                event=pb.Event(
                    seq_id=seq.seq_id,
                    name=f"kv_send:{kind}:{dst}",
                    t_unix=time.time(),
                    values={
                        "bytes": nbytes,
                        "saved_bytes": start_block * self.engine.block_bytes,
                        "queued_ms": leg.compute_ms[0],
                        "prefill_ms": leg.compute_ms[1],
                        "prefill_cpu_ms": leg.compute_ms[2],
                        "cached_tokens": leg.cached_tokens,
                        "export_ms": export[0],
                        "export_cpu_ms": export[1],
                    },
                )
            )
            sent_at = time.monotonic()
            fut = self.io.sender(kind, dst).send_async(kv, timeout_s=timeout)
            fut.add_done_callback(
                lambda f, dst=dst, kind=kind, t0=sent_at, sid=seq.seq_id: self._kv_sent(
                    sid, dst, kind, t0, f
                )
            )

    def _kv_sent(self, seq_id: str, dst: str, kind: str, t0: float, fut: Any) -> None:
        exc = fut.exception()
        if exc is not None:
            self.io.report(
                failure=pb.Failure(seq_id=seq_id, leg=f"kv_{kind}", error=f"to {dst}: {exc}")
            )
            return
        r = fut.result()
        self.io.report(
            event=pb.Event(
                seq_id=seq_id,
                name=f"kv_sent:{kind}:{dst}",
                t_unix=time.time(),
                values={
                    "bytes": r.bytes,
                    "seconds": time.monotonic() - t0,
                    "blocks": r.num_blocks,
                    "reconnects": r.reconnects,
                    "resent_blocks": r.resent_blocks,
                },
            )
        )

    # ---- relay and main: landing the KV -----------------------------------------------------
    def _adopt_prefix(self, leg: Leg, blocks: int) -> None:
        """Take exactly the `blocks` cached prefix blocks the router counted on (prefill sends the
        rest). Blocks evicted since the decision are recomputed from the prompt's token IDs."""
        seq, bs = leg.seq, self.engine.block_size
        blocks = reused_blocks(blocks, seq.num_prompt_tokens, bs)
        if blocks == 0:
            return
        have = self.engine.radix.match(seq.block_hashes(bs, blocks * bs))
        self.engine.allocator.incref(have)
        seq.block_table, seq.num_computed = list(have), len(have) * bs
        if len(have) < blocks:
            self.engine.compute_to(seq, blocks * bs)
            self.io.report(
                event=pb.Event(
                    seq_id=leg.seq_id,
                    name="cache_miss_recomputed",
                    t_unix=time.time(),
                    values={"blocks": blocks - len(have)},
                )
            )

    def _land(self, leg: Leg) -> None:
        if not self._room_for(leg):
            return
        t0, c0 = time.monotonic(), time.thread_time()
        try:
            self.engine.import_kv(leg.seq, leg.kv)
        except Exception as exc:  # noqa: BLE001 - a bad transfer: recompute from token IDs
            self._kv_failed(leg, f"cannot import KV: {exc}")
            return
        self.engine.reserve(
            leg.seq, self._total_tokens(leg)
        )  # fits: _room_for said so, nothing ran since
        # what landing cost this loop: the wait from the KV reaching this process to the loop taking
        # it (a step in progress, a core shared with busier workers, room in memory), then the import
        values = {
            "waited_ms": (t0 - leg.kv_at) * 1e3,
            "import_ms": (time.monotonic() - t0) * 1e3,
            "import_cpu_ms": (time.thread_time() - c0) * 1e3,
            "bytes": float(leg.kv.data.nbytes),
        }
        leg.kv, leg.kv_ready = None, True
        self.io.report(
            event=pb.Event(seq_id=leg.seq_id, name="kv_landed", t_unix=time.time(), values=values)
        )
        self._maybe_start(leg)

    @staticmethod
    def _total_tokens(leg: Leg) -> int:
        return leg.seq.num_prompt_tokens + leg.seq.sampling.max_tokens

    def _room_for(self, leg: Leg) -> bool:
        """Admit landed KV only when the request's prompt and whole output fit in the free blocks
        plus what the prefix cache can give back (`_land` then allocates them all): a decode step
        that found no free block would fail its request. Otherwise the leg waits, first come first
        served, under its deadline; one that could never fit fails now, saying so."""
        alloc, bs = self.engine.allocator, self.engine.block_size
        need = max(0, -(-self._total_tokens(leg) // bs) - len(leg.seq.block_table))
        if need > alloc.num_blocks - len(leg.seq.block_table):
            self._fail(
                leg,
                "compute",
                KVCacheFull(
                    need,
                    alloc.num_free,
                    alloc.num_blocks,
                    self.engine.block_bytes,
                    f"{leg.seq_id} (its prompt and max_tokens)",
                ),
            )
            return False
        if not self.memory_wait or self.memory_wait[0] is leg:
            room = alloc.num_free + (
                self.engine.radix.evictable_count() if self.engine.config.prefix_cache else 0
            )
            if need <= room:
                if self.memory_wait:
                    self.memory_wait.pop(0)
                return True
        if leg not in self.memory_wait:
            self.memory_wait.append(leg)
            self.io.report(
                event=pb.Event(
                    seq_id=leg.seq_id,
                    name="kv_waits_for_memory",
                    t_unix=time.time(),
                    values={"blocks": need},
                )
            )
        return False

    def _land_waiting(self) -> None:
        """Land waiting KV, oldest first, while it fits."""
        while self.memory_wait:
            leg = self.memory_wait[0]
            if leg.seq_id not in self.legs:  # ended while it waited
                self.memory_wait.pop(0)
                continue
            self._land(leg)
            if self.memory_wait and self.memory_wait[0] is leg:
                return

    def _kv_failed(self, leg: Leg, error: str) -> None:
        """The KV will not come: recompute the prompt from its token IDs (declared fallback)."""
        if leg.kv_ready:
            return
        try:
            self.engine.compute_to(leg.seq, leg.seq.num_prompt_tokens)
            self.engine.reserve(leg.seq, self._total_tokens(leg))
        except Exception as exc:  # noqa: BLE001
            self._fail(leg, "compute", exc)
            return
        leg.kv, leg.kv_ready = None, True
        self.io.report(event=pb.Event(seq_id=leg.seq_id, name="kv_recomputed", t_unix=time.time()))
        self.io.report(failure=pb.Failure(seq_id=leg.seq_id, leg="kv_recovered", error=error))
        self._maybe_start(leg)

    def _maybe_start(self, leg: Leg) -> None:
        if not leg.kv_ready or leg.decoding:
            return
        if leg.handoff:  # main: the relay's IDs are waiting
            if leg not in self.compute_queue:
                self.compute_queue.append(leg)
        elif leg.first is not None and not self._awaits_handoff(leg):
            self.engine.append_tokens(leg.seq, [leg.first])
            self._emit(
                leg, [leg.first], start=0
            )  # the client sees the first token once a decoder has it
            leg.decoding = True
            if leg.pending_handoff:
                self._start_handoff(leg, leg.pending_handoff)

    def _awaits_handoff(self, leg: Leg) -> bool:
        """Main decode on a relay path continues from the relay's IDs, not from the first token."""
        return self.op_type == "main_decode" and bool(leg.job.relay) and not leg.job.singular

    # ---- the Extend-Decode handoff -----------------------------------------------------------
    def _start_handoff(self, leg: Leg, mode: str) -> None:
        try:
            self._begin_handoff(leg, mode)
        except Exception as exc:  # noqa: BLE001 - main unreachable: the relay keeps decoding
            leg.handing_off, leg.decoding = "", not leg.seq.finished
            self.io.report(failure=pb.Failure(seq_id=leg.seq_id, leg="handoff", error=str(exc)))

    def _begin_handoff(self, leg: Leg, mode: str) -> None:
        if not leg.decoding:  # main's KV landed before the relay's: hand over once it decodes
            leg.pending_handoff = mode
            return
        leg.handing_off = mode
        if mode == "one_shot":
            leg.decoding = False
            self._send_handoff(leg, final=True)
        else:
            self._send_catch_up(leg, final=False, force=True)

    def _send_catch_up(self, leg: Leg, final: bool, force: bool = False) -> None:
        unsent = len(leg.seq.output_ids) - leg.sent_upto
        if force or final or unsent >= max(1, leg.job.catch_up_tokens):
            self._send_handoff(leg, final)

    def _finish_catch_up(self, leg: Leg) -> None:
        if leg.handing_off == "catch_up" and leg.decoding:
            leg.decoding = False
            self._send_handoff(leg, final=True)

    def _send_handoff(self, leg: Leg, final: bool) -> None:
        ids = leg.seq.output_ids[leg.sent_upto :]
        if leg.seq.finished and not final:
            return
        msg = TokenIds(leg.seq_id, leg.sent_upto, list(ids), final=final)
        leg.sent_upto += len(ids)
        client = self.io.sender("token_ids", leg.job.main)
        fut = client.send_async(msg, timeout_s=max(0.1, leg.deadline - time.monotonic()))
        self.io.report(
            event=pb.Event(
                seq_id=leg.seq_id,
                name="handoff_sent" if final else "catch_up_sent",
                t_unix=time.time(),
                values={"tokens": len(ids), "start": msg.start},
            )
        )
        if final:
            fut.add_done_callback(lambda f, sid=leg.seq_id: self._handoff_done(sid, f))

    def _handoff_done(self, seq_id: str, fut: Any) -> None:  # on a channel thread
        if fut.exception() is None:
            self.inbox.put(("abort", seq_id, "handed off"))
        else:  # main is gone: the relay finishes the request itself (declared fallback)
            self.io.report(
                failure=pb.Failure(seq_id=seq_id, leg="handoff", error=str(fut.exception()))
            )
            self.inbox.put(("keep_decoding", seq_id))

    def _owes_main(self, leg: Leg) -> bool:
        """A relay that finished a request before handing it off still sends main every ID: both
        pipelines end at main so its radix cache stays aligned with prefill's (PDD)."""
        return self.op_type == "relay_decode" and bool(leg.job.main) and not leg.job.singular

    def _extend(self, leg: Leg) -> None:
        """Main decode: extend over the relay's token IDs; after the final batch, sample and decode."""
        batch = leg.handoff.pop(0)
        if batch.start != len(leg.seq.output_ids):
            raise RuntimeError(
                f"handoff for {leg.seq_id} starts at {batch.start}, expected "
                f"{len(leg.seq.output_ids)}"
            )
        logits = self.engine.extend(leg.seq, batch.ids)
        self.io.report(
            event=pb.Event(
                seq_id=leg.seq_id,
                name="extend_done",
                t_unix=time.time(),
                values={"tokens": len(batch.ids)},
            )
        )
        if batch.final and self._complete(
            leg.seq
        ):  # the relay finished it: keep the KV, emit nothing
            self.finish(leg)
        elif batch.final:
            tok = self.engine.sample(leg.seq, logits)
            self._emit(leg, [tok], start=len(leg.seq.output_ids) - 1)
            if leg.seq.finished:
                self.finish(leg)
            else:
                leg.decoding = True
        elif not leg.handoff:
            self.io.release(
                leg.handoff_from, leg.seq_id, timeout_s=max(0.1, leg.deadline - time.monotonic())
            )

    @staticmethod
    def _complete(seq: Any) -> bool:
        out = seq.output_ids
        return len(out) >= seq.sampling.max_tokens or (
            bool(out) and out[-1] in seq.sampling.stop_token_ids
        )

    # ---- endings -----------------------------------------------------------------------------
    def finish(self, leg: Leg, reason: str = "") -> None:
        self.legs.pop(leg.seq_id, None)
        if leg in self.compute_queue:
            self.compute_queue.remove(leg)
        if leg in self.memory_wait:
            self.memory_wait.remove(leg)
        for r in self.io.kv_receivers:
            if not leg.kv_ready and reason:
                r.cancel(leg.seq_id, reason)
        if leg.seq is not None and leg.seq.block_table is not None:
            self.engine.free(leg.seq)

    def _fail(self, leg: Leg, where: str, exc: BaseException) -> None:
        self.io.report(
            failure=pb.Failure(seq_id=leg.seq_id, leg=where, error=f"{type(exc).__name__}: {exc}")
        )
        traceback.print_exc()
        self.finish(leg, reason=str(exc))

    def expire(self) -> None:
        now = time.monotonic()
        for leg in [leg for leg in self.legs.values() if leg.deadline < now]:
            self.io.report(
                failure=pb.Failure(
                    seq_id=leg.seq_id, leg="deadline", error=f"{self.instance}: deadline passed"
                )
            )
            self.finish(leg, reason="deadline passed")
        for sid in [
            s for s, items in self.early.items() if items and items[0][0] < now - EARLY_KEEP_S
        ]:
            del self.early[sid]

    # ---- status and the router's cache mirror ------------------------------------------------
    def status(self) -> pb.WorkerStatus:
        """A snapshot, taken on the loop thread (RPC threads read the last one)."""
        alloc = self.engine.allocator
        digest = 0
        cached = [h for h, _ in self.engine.radix]
        for h in cached:
            digest ^= h
        return pb.WorkerStatus(
            instance=self.instance,
            ready=True,
            running=len(self._decoding()),
            waiting=len(self.compute_queue) + sum(1 for x in self.legs.values() if not x.decoding),
            kv_blocks_used=alloc.num_blocks - alloc.num_free,
            kv_blocks_total=alloc.num_blocks,
            cached_blocks=len(cached),
            cache_digest=digest,
            decode_steps=self.decode_totals[0],
            decode_cpu_s=self.decode_totals[1],
            decode_seqs=self.decode_totals[2],
            decode_context_tokens=self.decode_totals[3],
            decode_wall_s=self.decode_totals[4],
        )

    def publish(self) -> None:
        if self.mirrored:
            radix = self.engine.radix
            if self.io.resync.is_set():  # the report stream reconnected and may have lost a delta
                self.io.resync.clear()
                radix.take_changes()
                self.io.report(cache=pb.CacheDelta(inserted=sorted(h for h, _ in radix), full=True))
            else:
                inserted, evicted = radix.take_changes()  # O(change), not a diff of the whole cache
                if inserted or evicted:
                    self.io.report(cache=pb.CacheDelta(inserted=inserted, evicted=evicted))
        if time.monotonic() - self._last_status > STATUS_EVERY_S:
            self._last_status = time.monotonic()
            self._status = self.status()
            self.io.report(status=self._status)

    def close(self) -> None:
        self.stopping.set()
        self.rpc.stop(grace=0.5)
        self.io.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m pddflow.runtime.worker WIRING.json INSTANCE", file=sys.stderr)
        return 2
    wiring = Wiring.load(Path(argv[0]))
    pin_self(
        wiring.cpus.get(argv[1], ()), wiring.nice.get(argv[1], 0)
    )  # before torch starts its threads
    worker = Worker(wiring, argv[1])
    signal.signal(signal.SIGTERM, lambda *_: worker.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: worker.stopping.set())
    print(f"{argv[1]} ready (pid {os.getpid()})", flush=True)
    try:
        worker.run()
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
