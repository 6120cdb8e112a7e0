"""One engine step timed, as `bench engine` times it at TP 1 and at every tensor-parallel degree."""

from __future__ import annotations

import time

from pddflow.core.payloads import SamplingParams
from pddflow.operators.engine import Engine


def prefill_seconds(engine: Engine, ids: list[int]) -> float:
    """One prefill of `ids` (its blocks stay cached for the next)."""
    seq = engine.add_sequence(ids, SamplingParams(max_tokens=1))
    t = time.perf_counter()
    engine.prefill(seq)
    dt = time.perf_counter() - t
    engine.free(seq)
    return dt


def decode_seconds(engine: Engine, prompts: list[list[int]], steps: int) -> float:
    """`steps` decode steps of the batch `prompts`, after one warm step at its size."""
    seqs = [engine.add_sequence(p, SamplingParams(max_tokens=steps + 2)) for p in prompts]
    for s in seqs:
        engine.prefill(s)
    engine.decode(seqs)  # warm: first step at this batch size
    t = time.perf_counter()
    for _ in range(steps):
        engine.decode(seqs)
    dt = time.perf_counter() - t
    for s in seqs:
        engine.free(s)
    return dt
