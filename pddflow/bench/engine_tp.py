"""`pddflow bench engine`'s tensor-parallel section: the same prefill and decode steps at TP 1 and
TP N on this machine, its cores shared by the ranks (threads // N each). On CPU this measures what
splitting costs (the step protocol, the gathers of partial sums, a rank per core), not a
speed-up: TP exists for models that do not fit one device (docs/engine.md, Tensor parallelism)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pddflow.bench.engine_steps import decode_seconds, prefill_seconds
from pddflow.core.payloads import SamplingParams
from pddflow.operators.engine import Engine, EngineConfig
from pddflow.operators.follower import local_group
from pddflow.operators.tensor_parallel import layout_problems
from pddflow.operators.weights import ModelSource


def measure_tp(
    spec: str,
    source: ModelSource,
    degrees: tuple[int, ...],
    prompt: Callable[[int], list[int]],
    prefill_tokens: int,
    decode_batch: int,
    decode_context: int,
    decode_steps: int,
    repeats: int,
    progress: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    threads = torch.get_num_threads()
    c = source.config
    kv = (decode_batch * (decode_context + decode_steps + 8) + prefill_tokens + 64) * 2
    kv_bytes = kv * c.kv_bytes_per_token(4)
    pre = prompt(prefill_tokens)
    dec = [prompt(decode_context) for _ in range(decode_batch)]
    out: dict[str, Any] = {
        "prefill_tokens": prefill_tokens,
        "decode_batch": decode_batch,
        "decode_context": decode_context,
        "statistic": f"best of {repeats}",
        "degrees": {},
    }
    tokens: dict[int, list[list[int]]] = {}
    try:
        for n in degrees:
            problems = layout_problems(c, n)
            if problems:
                out["degrees"][str(n)] = {"skipped": "; ".join(problems)}
                continue
            progress(f"tensor parallel {n}: prefill {prefill_tokens}, decode batch {decode_batch}")
            per_rank = max(1, threads // n)
            cfg = EngineConfig(kv_cache_bytes=kv_bytes, prefix_cache=False, num_threads=per_rank)
            with local_group(spec, cfg, n) as group:
                engine = Engine(source, cfg, group.tp)
                try:
                    prefill_seconds(engine, pre[:32])  # warm
                    prefill_s = min(prefill_seconds(engine, pre) for _ in range(repeats))
                    step_s = min(
                        decode_seconds(engine, dec, decode_steps) / decode_steps
                        for _ in range(repeats)
                    )
                    greedy = engine.generate(dec[:2], SamplingParams(max_tokens=8))
                    tokens[n] = [s.output_ids for s in greedy]
                finally:
                    engine.close()
            out["degrees"][str(n)] = {
                "threads_per_rank": per_rank,
                "prefill_ms": round(prefill_s * 1e3, 2),
                "prefill_tok_s": round(prefill_tokens / prefill_s, 1),
                "decode_step_ms": round(step_s * 1e3, 2),
                "decode_tok_s": round(decode_batch / step_s, 1),
            }
    finally:
        torch.set_num_threads(threads)
    base = out["degrees"].get("1", {})
    for r in out["degrees"].values():
        if "prefill_ms" in r and "prefill_ms" in base:
            r["prefill_vs_tp1"] = round(r["prefill_ms"] / base["prefill_ms"], 2)
            r["decode_vs_tp1"] = round(r["decode_step_ms"] / base["decode_step_ms"], 2)
    out["same_greedy_tokens"] = len({str(t) for t in tokens.values()}) <= 1
    return out
