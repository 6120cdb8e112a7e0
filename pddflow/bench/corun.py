"""The co-run point of `pddflow bench engine`: prefill and decode steps on one core, alone and while
another process decodes on another (pinned cores still share the cache and memory bus)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from pddflow.core.child_python import python_module

RESTART_STEPS = 500
READY_TIMEOUT_S = 120.0  # the companion loads the model before it says "ready"


def cores_for_corun() -> tuple[int, int] | None:
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else None


def measure(
    spec: str,
    threads: int,
    prefill: Callable[[], float],
    decode_step: Callable[[], float],
    repeats: int,
    summary: Callable[[list[float]], float],
    batch: int = 4,
    context: int = 768,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any] | None:
    """Step seconds alone and beside the companion, alternating (SIGSTOP / SIGCONT) so a drift
    falls on both sides; None without two cores, `{"skipped": why}` if the companion fails."""
    cores = cores_for_corun()
    if cores is None:
        return None
    mine, other = cores
    before = os.sched_getaffinity(0)
    progress(f"co-run: starting a decoding companion on core {other}")
    companion = subprocess.Popen(
        [
            *python_module("pddflow.bench.corun"),
            spec,
            str(other),
            str(threads),
            str(batch),
            str(context),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        os.sched_setaffinity(0, {mine})
        if not _started(companion, READY_TIMEOUT_S):
            return {
                "skipped": f"the decoding companion did not start within {READY_TIMEOUT_S:.0f} s "
                f"(exit status {companion.poll()})"
            }
        samples: dict[str, dict[str, list[float]]] = {
            "alone": {"p": [], "d": []},
            "corun": {"p": [], "d": []},
        }
        for i in range(max(repeats, 1)):
            for mode in ("alone", "corun"):
                progress(f"co-run: {mode} ({i + 1}/{repeats})")
                companion.send_signal(signal.SIGCONT if mode == "corun" else signal.SIGSTOP)
                time.sleep(0.2)  # let the companion get (or leave) the cache and memory bus
                samples[mode]["p"].append(prefill())
                samples[mode]["d"].append(decode_step())
    finally:
        os.sched_setaffinity(0, before)
        companion.kill()  # SIGKILL ends a stopped process too
        companion.wait(timeout=10)
    p_alone, p_co = summary(samples["alone"]["p"]), summary(samples["corun"]["p"])
    d_alone, d_co = summary(samples["alone"]["d"]), summary(samples["corun"]["d"])
    return {
        "cores": [mine, other],
        "companion": f"decode batch {batch} over {context} tokens",
        "prefill_ms": {"alone": round(p_alone * 1e3, 2), "corun": round(p_co * 1e3, 2)},
        "decode_step_ms": {"alone": round(d_alone * 1e3, 2), "corun": round(d_co * 1e3, 2)},
        "prefill_factor": round(p_co / p_alone, 3),
        "decode_factor": round(d_co / d_alone, 3),
    }


def _started(companion: subprocess.Popen, timeout_s: float) -> bool:
    import select

    if companion.stdout is None:
        return False
    ready, _, _ = select.select([companion.stdout], [], [], timeout_s)
    return bool(ready) and companion.stdout.readline().strip() == "ready"


def _companion(spec: str, cpu: int, threads: int, batch_size: int, context: int) -> None:
    import random

    import torch

    from pddflow.core.payloads import SamplingParams
    from pddflow.operators.engine import Engine, EngineConfig
    from pddflow.operators.weights import load_model_source

    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(threads)
    source = load_model_source(spec)
    need = batch_size * (context + RESTART_STEPS + 64) * source.config.kv_bytes_per_token(4) * 2
    engine = Engine(source, EngineConfig(kv_cache_bytes=need, prefix_cache=False))
    rng = random.Random(7)
    vocab = min(source.config.vocab_size, 256)

    def batch() -> list:
        seqs = [
            engine.add_sequence(
                [rng.randrange(vocab) for _ in range(context)],
                SamplingParams(max_tokens=RESTART_STEPS + 8),
            )
            for _ in range(batch_size)
        ]
        for s in seqs:
            engine.prefill(s)
        return seqs

    seqs = batch()
    print("ready", flush=True)
    steps = 0
    while True:
        engine.decode(seqs)
        steps += 1
        if steps % RESTART_STEPS == 0:  # keep the context near `context`
            for s in seqs:
                engine.free(s)
            seqs = batch()


if __name__ == "__main__":
    _companion(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
