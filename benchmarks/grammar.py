"""The cost of structured output per token: decode steps of a batch of sequences constrained by a
JSON schema's grammar against the same batch unconstrained, on one engine (the built-in model by
default), steps alternating so the machine's drift hits both; and the mask alone (the grammar
engine's share). Reported as medians and their ratio.

    python benchmarks/grammar.py [--model builtin:tiny-llama] [--batch 8] [--steps 40] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from pddflow.core.payloads import SamplingParams
from pddflow.operators.engine import Engine
from pddflow.operators.grammar import json_schema_grammar

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 64},
        "items": {"type": "array", "items": {"type": "integer"}},
        "note": {"type": "string"},
    },
    "required": ["name", "items", "note"],
    "additionalProperties": False,
}


def batch(engine: Engine, n: int, grammar: str | None) -> list:
    """n sequences past their prefill, each with room for the whole run."""
    params = SamplingParams(max_tokens=10_000, temperature=1.0, grammar=grammar)
    seqs = []
    for i in range(n):
        s = engine.add_sequence(engine.tokenizer.encode(f"Item {i} as JSON: "), params)
        engine.prefill(s)
        seqs.append(s)
    return seqs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny-llama")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    engine = Engine.from_spec(args.model)
    grammar = json_schema_grammar(SCHEMA)
    runs = {"unconstrained": batch(engine, args.batch, None)}
    runs["json_schema"] = batch(engine, args.batch, grammar)
    step_ms: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.steps):
        for name, seqs in runs.items():
            live = [s for s in seqs if not s.finished]
            if not live:
                continue
            t0 = time.perf_counter()
            engine.decode(live)
            step_ms[name].append((time.perf_counter() - t0) * 1e3 / len(live))
    # the mask alone: a fresh state fed each constrained sequence's output so far, then masked
    grammars = engine.grammars
    assert grammars is not None
    mask_ms = []
    for s in runs["json_schema"]:
        state = grammars.state(grammar)
        for k in range(1, len(s.generated_ids) + 1):
            grammars.mask(state, s.generated_ids[: k - 1])
            t0 = time.perf_counter()
            state.matcher.consume_tokens(s.generated_ids[k - 1 : k])
            state.consumed = k
            grammars.mask(state, s.generated_ids[:k])
            mask_ms.append((time.perf_counter() - t0) * 1e3)
    med = {k: statistics.median(v) for k, v in step_ms.items()}
    out = {
        "model": args.model,
        "batch": args.batch,
        "steps": args.steps,
        "ms_per_token_p50": med,
        "ratio_constrained_over_unconstrained": med["json_schema"] / med["unconstrained"],
        "mask_ms_p50": statistics.median(mask_ms),
        "mask_ms_p90": statistics.quantiles(mask_ms, n=10)[-1],
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{args.model}, batch {args.batch}, {args.steps} steps (ms per token, median):")
    for k, v in med.items():
        print(f"  {k:14s} {v:8.3f}")
    print(f"  ratio          {out['ratio_constrained_over_unconstrained']:8.2f}x")
    print(f"  mask alone     {out['mask_ms_p50']:8.3f} (P90 {out['mask_ms_p90']:.3f})")


if __name__ == "__main__":
    main()
