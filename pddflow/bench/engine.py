"""`pddflow bench engine`: the engine beside HF transformers on the same weights and threads
(docs/engine.md); "engine only" fields are calibration points, not comparisons."""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pddflow.bench.engine_steps import decode_seconds, prefill_seconds
from pddflow.core.payloads import Request, SamplingParams
from pddflow.operators.engine import Engine, EngineConfig
from pddflow.operators.hf_reference import (
    hf_decode,
    hf_extend,
    hf_model_from_source,
    hf_static_batches,
)
from pddflow.operators.weights import ModelSource, load_model_source


@dataclass(frozen=True)
class BenchSizes:
    prefill_lengths: tuple[int, ...] = (512, 2048)
    decode_batches: tuple[int, ...] = (1, 8, 32)
    decode_context: int = 128
    decode_steps: int = 16
    # engine only: the largest decode batch over a long context
    long_context: int = 1024
    extend_tokens: int = 100
    extend_context: int = 512
    # engine only: (tokens, context) of a prefill over a long cached context
    long_extend: tuple[int, int] = (128, 2048)
    # engine only: (new, cached) prompts over a cached prefix
    prefill_grid: tuple[tuple[int, int], ...] = (
        (128, 0),
        (512, 0),
        (128, 512),
        (512, 512),
        (128, 2048),
        (512, 2048),
    )
    corun: bool = True  # engine only: steps alone and beside a decoding process (bench/corun.py)
    # engine only: the same steps at these tensor-parallel degrees on this machine (engine_tp.py)
    tensor_parallel: tuple[int, ...] = (1, 2)
    mixed_requests: int = 32
    mixed_prompt: tuple[int, int] = (16, 1024)
    mixed_output: tuple[int, int] = (8, 256)
    repeats: int = 2
    mixed_repeats: int = 1
    statistic: str = "best"  # of the repeats: best (comparisons) or median (calibration)


# What `simulate --calibrate` fits: the median of 3, since the best of 3 is an idle machine that a
# deployment sharing its cores never sees (docs/simulator.md, Fidelity).
QUICK = BenchSizes(
    prefill_lengths=(64, 128),
    decode_batches=(1, 4),
    decode_context=32,
    decode_steps=6,
    long_context=768,
    extend_tokens=16,
    extend_context=48,
    long_extend=(128, 768),
    prefill_grid=(
        (32, 0),
        (256, 0),
        (512, 0),
        (32, 256),
        (128, 256),
        (256, 256),
        (32, 768),
        (128, 768),
        (256, 768),
    ),
    mixed_requests=6,
    mixed_prompt=(8, 64),
    mixed_output=(2, 12),
    repeats=3,
    statistic="median",
    tensor_parallel=(),
)


def _best_pair(
    engine_fn: Callable[[], float],
    hf_fn: Callable[[], float],
    repeats: int,
    statistic: str = "best",
) -> tuple[float, float]:
    """Alternating engine and HF, so both see the same machine load."""
    engine_times: list[float] = []
    hf_times: list[float] = []
    for _ in range(max(repeats, 1)):
        engine_times.append(engine_fn())
        hf_times.append(hf_fn())
    return _summary(engine_times, statistic), _summary(hf_times, statistic)


def _summary(timings: list[float], statistic: str) -> float:
    return statistics.median(timings) if statistic == "median" else min(timings)


def _ratio(engine: float, hf: float) -> float:
    return round(engine / hf, 3) if hf > 0 else float("inf")


def run_bench(
    spec: str = "builtin:tiny-llama",
    sizes: BenchSizes = BenchSizes(),
    batch: int = 8,
    seed: int = 0,
    threads: int | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    source = load_model_source(spec)
    vocab = source.config.vocab_size
    rng = random.Random(seed)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(min(vocab, 256)) for _ in range(n)]

    longest = max(
        max(sizes.prefill_lengths),
        sizes.mixed_prompt[1] + sizes.mixed_output[1],
        sizes.extend_context + sizes.extend_tokens + 8,
        sum(sizes.long_extend) + 8,
    )
    slots = max(
        max(sizes.decode_batches)
        * (max(sizes.decode_context, sizes.long_context) + sizes.decode_steps + 4),
        batch * longest,
    )
    kv_bytes = (slots + 64 * batch) * source.config.kv_bytes_per_token(4) * 2
    progress("loading engine and HF model")
    engine = Engine(source, EngineConfig(kv_cache_bytes=kv_bytes, prefix_cache=False))
    hf = hf_model_from_source(source)
    out: dict[str, Any] = {
        "model": spec,
        "threads": torch.get_num_threads(),
        "device": str(engine.device),
        "batch_invariant": engine.numerics.invariant,
        "statistic": f"{sizes.statistic} of {sizes.repeats}",
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }

    out["prefill"] = {}
    for n in sizes.prefill_lengths:
        progress(f"prefill {n} tokens")
        _warm_prefill(engine, hf, prompt(min(n, 64)))

        def hf_once(n: int = n) -> float:
            ids = torch.tensor([prompt(n)])
            with torch.inference_mode():
                t = time.perf_counter()
                hf(ids, use_cache=True, logits_to_keep=1)
                return time.perf_counter() - t

        engine_s, hf_s = _best_pair(
            lambda n=n: prefill_seconds(engine, prompt(n)), hf_once, sizes.repeats, sizes.statistic
        )
        out["prefill"][str(n)] = {
            "engine_tok_s": round(n / engine_s, 1),
            "hf_tok_s": round(n / hf_s, 1),
            "ratio": _ratio(hf_s, engine_s),
        }

    out["decode"] = {"context": sizes.decode_context}
    for b in sizes.decode_batches:
        progress(f"decode batch {b}")
        prompts = [prompt(sizes.decode_context) for _ in range(b)]
        engine_s, hf_s = _best_pair(
            lambda prompts=prompts: decode_seconds(engine, prompts, sizes.decode_steps),
            lambda prompts=prompts: hf_decode(hf, prompts, sizes.decode_steps),
            sizes.repeats,
            sizes.statistic,
        )
        toks = b * sizes.decode_steps
        out["decode"][str(b)] = {
            "engine_tok_s": round(toks / engine_s, 1),
            "hf_tok_s": round(toks / hf_s, 1),
            "ratio": _ratio(hf_s, engine_s),
            "engine_step_ms": round(engine_s / sizes.decode_steps * 1e3, 2),
            "hf_step_ms": round(hf_s / sizes.decode_steps * 1e3, 2),
        }

    if sizes.long_context > sizes.decode_context:
        b = max(sizes.decode_batches)
        progress(f"decode batch {b} over {sizes.long_context} tokens of context")
        prompts = [prompt(sizes.long_context) for _ in range(b)]
        runs = [decode_seconds(engine, prompts, sizes.decode_steps) for _ in range(sizes.repeats)]
        engine_s = _summary(runs, sizes.statistic)
        out["decode_long"] = {
            "context": sizes.long_context,
            "batch": b,
            "engine_step_ms": round(engine_s / sizes.decode_steps * 1e3, 2),
        }

    progress(f"extend {sizes.extend_tokens} tokens vs one decode step")
    ctx_prompt = prompt(sizes.extend_context)
    known = prompt(sizes.extend_tokens)
    ext_s, hf_ext = _best_pair(
        lambda: _engine_extend(engine, ctx_prompt, known),
        lambda: hf_extend(hf, ctx_prompt, known),
        sizes.repeats + 1,
        sizes.statistic,
    )
    step_s, hf_step = _best_pair(
        lambda: decode_seconds(engine, [ctx_prompt], 1),
        lambda: hf_decode(hf, [ctx_prompt], 1),
        sizes.repeats + 1,
        sizes.statistic,
    )
    out["extend"] = {
        "tokens": sizes.extend_tokens,
        "context": sizes.extend_context,
        "extend_ms": round(ext_s * 1e3, 2),
        "decode_step_ms": round(step_s * 1e3, 2),
        "extend_over_step": round(ext_s / step_s, 2),
        "hf_extend_ms": round(hf_ext * 1e3, 2),
        "hf_decode_step_ms": round(hf_step * 1e3, 2),
    }

    n, ctx = sizes.long_extend
    if n > 0 and ctx > 0:
        progress(f"{n} new tokens over {ctx} cached")
        ctx_prompt, known = prompt(ctx), prompt(n)
        runs = [_engine_extend(engine, ctx_prompt, known) for _ in range(sizes.repeats)]
        out["extend_long"] = {
            "tokens": n,
            "context": ctx,
            "extend_ms": round(_summary(runs, sizes.statistic) * 1e3, 2),
        }

    if sizes.prefill_grid:
        out["prefill_grid"] = _prefill_grid(source, sizes, prompt, kv_bytes, progress)

    if sizes.corun:
        from pddflow.bench.corun import measure

        n_pre, b_dec = max(sizes.prefill_lengths), max(sizes.decode_batches)
        dec_prompts = [prompt(sizes.decode_context) for _ in range(b_dec)]

        corun = measure(
            spec,
            torch.get_num_threads(),
            lambda: prefill_seconds(engine, prompt(n_pre)),
            lambda: decode_seconds(engine, dec_prompts, sizes.decode_steps) / sizes.decode_steps,
            sizes.repeats,
            lambda xs: _summary(xs, sizes.statistic),
            b_dec,
            max(sizes.long_context, sizes.decode_context),
            progress,
        )
        if corun is not None:
            if "skipped" not in corun:
                corun["prefill_tokens"], corun["decode_batch"] = n_pre, b_dec
            out["corun"] = corun

    if sizes.tensor_parallel:
        from pddflow.bench.engine_tp import measure_tp

        out["tensor_parallel"] = measure_tp(
            spec,
            source,
            sizes.tensor_parallel,
            prompt,
            min(max(sizes.prefill_lengths), 512),
            min(max(sizes.decode_batches), 8),
            sizes.decode_context,
            sizes.decode_steps,
            sizes.repeats,
            progress,
        )

    workload_rng = random.Random(seed + 1)
    reqs = []
    for i in range(sizes.mixed_requests):
        prompt_len = workload_rng.randint(*sizes.mixed_prompt)
        output_len = workload_rng.randint(*sizes.mixed_output)
        reqs.append(
            Request(
                f"r{i}",
                [workload_rng.randrange(min(vocab, 256)) for _ in range(prompt_len)],
                SamplingParams(max_tokens=output_len),
            )
        )
    want = sum(r.sampling.max_tokens for r in reqs)
    prompt_tokens = sum(len(r.prompt_ids) for r in reqs)
    # Wall time is what users see; process CPU time is the load-robust figure on a shared machine
    # (with one thread it does not count time spent waiting for a core).
    best: dict[str, tuple[float, float]] = {}
    hf_generated = padded_prompt = 0
    for rep in range(max(sizes.mixed_repeats, 1)):
        progress(f"mixed workload: engine, {len(reqs)} requests, batch {batch} ({rep + 1})")
        w, c = time.perf_counter(), time.process_time()
        seqs = engine.generate(reqs, max_batch=batch)
        engine_s, engine_cpu = time.perf_counter() - w, time.process_time() - c
        got = sum(len(s.output_ids) for s in seqs)
        if got != want:
            raise RuntimeError(f"engine produced {got} tokens, expected {want}")
        progress(f"mixed workload: HF generate, static padded batches of {batch} ({rep + 1})")
        c = time.process_time()
        hf_s, hf_generated, padded_prompt = hf_static_batches(hf, reqs, batch)
        hf_cpu = time.process_time() - c
        best["engine"] = min(best.get("engine", (engine_s, engine_cpu)), (engine_s, engine_cpu))
        best["hf"] = min(best.get("hf", (hf_s, hf_cpu)), (hf_s, hf_cpu))
    (engine_s, engine_cpu), (hf_s, hf_cpu) = best["engine"], best["hf"]
    out["mixed"] = {
        "requests": len(reqs),
        "batch": batch,
        "prompt_tokens": prompt_tokens,
        "output_tokens": want,
        "engine_s": round(engine_s, 2),
        "hf_s": round(hf_s, 2),
        "engine_tok_s": round(want / engine_s, 1),
        "hf_tok_s": round(want / hf_s, 1),
        "ratio": _ratio(hf_s, engine_s),
        "engine_cpu_s": round(engine_cpu, 2),
        "hf_cpu_s": round(hf_cpu, 2),
        "cpu_ratio": _ratio(hf_cpu, engine_cpu),
        "hf_generated_tokens": hf_generated,
        "hf_padded_prompt_tokens": padded_prompt,
    }
    out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return out


def _prefill_grid(
    source: ModelSource,
    sizes: BenchSizes,
    prompt: Callable[[int], list[int]],
    kv_bytes: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Each (new, cached): fresh tokens over a prefix prefilled once, as a prefill worker runs them,
    on a second engine (the benchmark's own has no prefix cache): one more copy of the weights."""
    need = max(n + c for n, c in sizes.prefill_grid) + 64
    kv = max(kv_bytes, 4 * need * source.config.kv_bytes_per_token(4))
    engine = Engine(source, EngineConfig(kv_cache_bytes=kv, prefix_cache=True))
    points = []
    for new, cached in sizes.prefill_grid:
        progress(f"prefill {new} tokens over {cached} cached")
        prefix = prompt(cached)
        if cached:
            prefill_seconds(engine, prefix + prompt(1))  # leaves the prefix's full blocks cached
        runs = []
        for _ in range(sizes.repeats + 1):  # the first one warms this shape
            seq = engine.add_sequence(prefix + prompt(new), SamplingParams(max_tokens=1))
            got = engine.reuse_prefix(seq)
            if got != cached - cached % engine.block_size:
                raise RuntimeError(f"prefix cache gave {got} of {cached} cached tokens")
            t = time.perf_counter()
            engine.prefill(seq)
            runs.append(time.perf_counter() - t)
            engine.free(seq)
        points.append(
            {
                "tokens": new,
                "cached": got,
                "prefill_ms": round(_summary(runs[1:], sizes.statistic) * 1e3, 2),
            }
        )
    return {"statistic": f"{sizes.statistic} of {sizes.repeats}", "points": points}


def _warm_prefill(engine: Engine, hf, ids: list[int]) -> None:
    seq = engine.add_sequence(ids, SamplingParams(max_tokens=1))
    engine.prefill(seq)
    engine.free(seq)
    with torch.inference_mode():
        hf(torch.tensor([ids]))


def _engine_extend(engine: Engine, ctx: list[int], known: list[int]) -> float:
    seq = engine.add_sequence(ctx, SamplingParams(max_tokens=len(known) + 4))
    engine.prefill(seq)
    t = time.perf_counter()
    engine.extend(seq, known)
    dt = time.perf_counter() - t
    engine.free(seq)
    return dt
