"""The colocated reference's scheduler: continuous batching over one engine's step entry points.

Admit requests in order while the batch has room and the KV pool holds each one's worst case
(prompt + max_tokens) next to what the running ones may still take, prefill each, then one decode
step for the batch; repeat. Admitted requests therefore never run dry mid-decode. `Engine.generate`
runs it: `pddflow generate`, `bench engine`'s mixed workload and the tests' reference outputs. The
PDD workers schedule themselves (runtime/workers/loop.py); the engine only computes steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Protocol

from pddflow.core.kv_budget import KVFit, blocks_for, kv_fit
from pddflow.core.payloads import Request, SamplingParams
from pddflow.operators.block_allocator import BlockAllocator, KVCacheFull
from pddflow.operators.radix_cache import RadixCache
from pddflow.operators.sequence import Sequence


class StepEngine(Protocol):
    """What the loop uses of an engine (operators/engine.py's `Engine`)."""

    allocator: BlockAllocator
    radix: RadixCache
    block_bytes: int

    @property
    def block_size(self) -> int: ...

    def add_sequence(
        self, prompt_ids: Seq[int], sampling: SamplingParams = ..., seq_id: str | None = None
    ) -> Sequence: ...

    def prefill(self, seq: Sequence, chunk_size: int | None = None) -> int: ...

    def decode(self, seqs: Seq[Sequence]) -> list[int]: ...

    def free(self, seq: Sequence) -> None: ...


def generate(
    engine: StepEngine,
    requests: Seq[Request] | Seq[Seq[int]],
    sampling: SamplingParams | None = None,
    max_batch: int = 8,
    on_step: Callable[[list[Sequence]], None] | None = None,
) -> list[Sequence]:
    """Run `requests` (Requests, or prompts sampled with `sampling`) to the end; the finished
    sequences in request order. `on_step` sees the running batch after every decode step."""
    reqs = [
        r if isinstance(r, Request) else Request(f"req-{i}", list(r), sampling or SamplingParams())
        for i, r in enumerate(requests)
    ]
    waiting = deque(enumerate(reqs))
    done: dict[int, Sequence] = {}
    running: list[tuple[int, Sequence]] = []
    while waiting or running:
        while (
            waiting
            and len(running) < max_batch
            and _fits(engine, waiting[0][1], [s for _, s in running])
        ):
            i, r = waiting.popleft()
            seq = engine.add_sequence(r.prompt_ids, r.sampling, r.request_id)
            if r.sampling.max_tokens <= 0:
                seq.finished, seq.finish_reason = True, "length"
                done[i] = seq
                continue
            engine.prefill(seq)
            if seq.finished:
                engine.free(seq)
                done[i] = seq
            else:
                running.append((i, seq))
        if not running:
            if not waiting:
                break  # everything admitted finished during prefill
            r = waiting[0][1]
            raise _full(engine, _worst_case(engine, r).blocks, f"request {r.request_id}")
        engine.decode([s for _, s in running])
        if on_step is not None:
            on_step([s for _, s in running])
        still: list[tuple[int, Sequence]] = []
        for i, s in running:
            if s.finished:
                engine.free(s)
                done[i] = s
            else:
                still.append((i, s))
        running = still
    return [done[i] for i in range(len(reqs))]


def _worst_case(engine: StepEngine, r: Request) -> KVFit:
    return kv_fit(
        len(r.prompt_ids), r.sampling.max_tokens, engine.block_size, engine.allocator.num_blocks
    )


def _fits(engine: StepEngine, r: Request, running: list[Sequence]) -> bool:
    """Whether `r`'s worst case fits now beside the blocks the running ones may still take
    (cached blocks no sequence reads count as room: they are evicted on demand)."""
    fit = _worst_case(engine, r)
    if not fit.fits:
        raise _full(engine, fit.blocks, f"request {r.request_id}")
    bs = engine.block_size
    reserved = sum(
        max(0, blocks_for(s.num_prompt_tokens + s.sampling.max_tokens, bs) - len(s.block_table))
        for s in running
    )
    free = engine.allocator.num_free
    if fit.blocks + reserved <= free:
        return True  # without walking the radix tree (evictable_count is O(cache size))
    return fit.blocks + reserved <= free + engine.radix.evictable_count()


def _full(engine: StepEngine, needed: int, what: str) -> KVCacheFull:
    alloc = engine.allocator
    return KVCacheFull(needed, alloc.num_free, alloc.num_blocks, engine.block_bytes, what)
