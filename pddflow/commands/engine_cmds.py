"""`pddflow generate` (the colocated reference) and `pddflow bench engine`.

torch and transformers are imported inside the command functions, so importing this module (which
`pddflow --help` does) stays instant.
"""

from __future__ import annotations

import json

import typer

DEFAULT_MODEL = "builtin:tiny-llama"


def _fail(msg: str) -> typer.Exit:
    typer.echo(f"error: {msg}", err=True)
    return typer.Exit(2)


def _parse_ids(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("--prompt-ids is empty")
    ids = []
    for p in parts:
        try:
            ids.append(int(p))
        except ValueError:
            raise ValueError(
                f"--prompt-ids: {p!r} is not an integer (expected e.g. 1,2,3)"
            ) from None
    return ids


def generate(
    model: str = typer.Option(
        DEFAULT_MODEL,
        "--model",
        "-m",
        help="builtin:tiny-llama, a local HF checkpoint directory (config.json + *.safetensors) "
        "or a Hugging Face Hub id owner/name (its cache honoured; HF_HUB_OFFLINE=1: cache only)",
    ),
    prompt: str | None = typer.Option(
        None, "--prompt", "-p", help="prompt text (needs a tokenizer)"
    ),
    prompt_ids: str | None = typer.Option(
        None, "--prompt-ids", help="prompt token IDs, comma-separated: 1,2,3"
    ),
    max_tokens: int = typer.Option(16, "--max-tokens", "-n", min=1, help="most tokens to generate"),
    temperature: float = typer.Option(0.0, "--temperature", "-t", min=0.0, help="0 = greedy"),
    top_p: float = typer.Option(
        1.0,
        "--top-p",
        min=0.0,
        max=1.0,
        help="nucleus sampling mass in (0, 1] (with temperature > 0)",
    ),
    seed: int | None = typer.Option(None, "--seed", help="sampling seed (same seed, same tokens)"),
    json_out: bool = typer.Option(False, "--json", help='print {"token_ids": [...], "text": ...}'),
    tensor_parallel: int = typer.Option(
        1,
        "--tensor-parallel",
        "--tp",
        min=1,
        help="ranks of the instance: N-1 follower processes on this machine, rank 0 here",
    ),
    expert_parallel: bool = typer.Option(
        False,
        "--expert-parallel",
        help="with --tensor-parallel on a mixture of experts: whole experts per rank "
        "(num_experts / N each) instead of a slice of every expert",
    ),
) -> None:
    """Generate with the colocated reference engine (prefill + decode on one instance)."""
    if (prompt is None) == (prompt_ids is None):
        raise _fail("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    if top_p == 0:
        raise _fail("--top-p must be in (0, 1]: 0 keeps no token")
    ids: list[int] = []
    if prompt_ids is not None:
        try:
            ids = _parse_ids(prompt_ids)
        except ValueError as exc:
            raise _fail(str(exc)) from None

    from pddflow.core.model_config import ModelSpecError
    from pddflow.core.payloads import SamplingParams
    from pddflow.operators.block_allocator import KVCacheFull
    from pddflow.operators.one_request import generate_one
    from pddflow.operators.tensor_parallel import TPPeerLost
    from pddflow.operators.weights import load_model_source

    # stderr lines, not a live bar: the loading and the generation are single calls
    typer.echo(f"loading {model}", err=True)
    try:
        source = load_model_source(model)
    except ModelSpecError as exc:
        raise _fail(str(exc)) from None
    tok = source.tokenizer
    if prompt is not None:
        if tok is None:
            raise _fail(f"{model} has no tokenizer.json; pass --prompt-ids instead of --prompt")
        ids = tok.encode(prompt)
        if not ids:
            raise _fail("the prompt encodes to no tokens")
    vocab = source.config.vocab_size
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise _fail(f"--prompt-ids {bad[:5]} are outside the vocabulary [0, {vocab})")
    stop = tuple(tok.eos_token_ids if tok is not None else source.config.eos_token_ids)
    params = SamplingParams(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop_token_ids=stop
    )
    try:
        out_ids, took = generate_one(
            model,
            source,
            ids,
            params,
            tensor_parallel,
            expert_parallel,
            lambda line: typer.echo(line, err=True),
        )
    except (KVCacheFull, ValueError) as exc:
        raise _fail(str(exc)) from None
    except TPPeerLost as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{len(out_ids)} tokens in {took:.1f} s", err=True)
    text = tok.decode(out_ids) if tok is not None else None
    if json_out:
        typer.echo(json.dumps({"token_ids": out_ids, "text": text}))
    else:
        typer.echo(text if text is not None else " ".join(map(str, out_ids)))


def bench_engine(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="model spec to benchmark"),
    batch: int = typer.Option(
        8, "--batch", help="mixed workload: engine's max batch = HF's static batch size"
    ),
    seed: int = typer.Option(0, "--seed", help="workload seed"),
    threads: int | None = typer.Option(
        None, "--threads", help="torch threads for both (default: torch's)"
    ),
    mixed_repeats: int = typer.Option(
        1,
        "--mixed-repeats",
        help="run the mixed workload N times (alternating "
        "engine and HF), keep the best of each: for noisy shared machines",
    ),
    quick: bool = typer.Option(
        False,
        "--quick",
        help="short sizes, medians of 3 (about 30 s): what "
        "`pddflow simulate --calibrate` fits; not a comparison with HF",
    ),
    tensor_parallel: str | None = typer.Option(
        None,
        "--tensor-parallel",
        help="degrees to measure the same steps at on this machine, e.g. 1,2 (default: 1,2; "
        "none with --quick); 0 skips",
    ),
    json_out: bool = typer.Option(False, "--json", help="print results as JSON"),
) -> None:
    """Engine vs HF transformers on the same weights: prefill, decode, extend, mixed serving."""
    if batch < 1 or mixed_repeats < 1 or (threads is not None and threads < 1):
        raise _fail("--batch, --mixed-repeats and --threads must be >= 1")
    degrees: tuple[int, ...] | None = None
    if tensor_parallel is not None:
        try:
            degrees = tuple(int(d) for d in tensor_parallel.split(",") if d.strip())
        except ValueError:
            raise _fail(
                f"--tensor-parallel: expected degrees like 1,2, got {tensor_parallel!r}"
            ) from None
        degrees = tuple(d for d in degrees if d != 0)
        if any(d < 1 for d in degrees):
            raise _fail("--tensor-parallel degrees must be >= 1")
    import dataclasses

    from rich.console import Console

    from pddflow.bench.engine import QUICK, BenchSizes, run_bench
    from pddflow.commands.progress import progress_bar
    from pddflow.core.model_config import ModelSpecError

    err = Console(stderr=True)
    with progress_bar(err) as bar:
        task = bar.add_task("starting", total=None)
        try:
            sizes = dataclasses.replace(
                QUICK if quick else BenchSizes(), mixed_repeats=mixed_repeats
            )
            if degrees is not None:
                sizes = dataclasses.replace(sizes, tensor_parallel=degrees)
            res = run_bench(
                model,
                sizes,
                batch=batch,
                seed=seed,
                threads=threads,
                progress=lambda msg: bar.update(task, description=msg),
            )
        except ModelSpecError as exc:
            raise _fail(str(exc)) from None
    if json_out:
        typer.echo(json.dumps(res, indent=2))
        return
    _print_table(res)


def _print_table(res: dict) -> None:
    from rich.table import Table

    from pddflow.commands.progress import console

    t = Table(title=f"pddflow engine vs HF transformers ({res['model']}, {res['threads']} threads)")
    for col in ("measurement", "engine", "HF", "engine / HF"):
        t.add_column(col, justify="right" if col != "measurement" else "left")
    for n, r in res["prefill"].items():
        t.add_row(
            f"prefill {n} tokens (tok/s)",
            f"{r['engine_tok_s']:.0f}",
            f"{r['hf_tok_s']:.0f}",
            f"{r['ratio']:.2f}x",
        )
    for b, r in res["decode"].items():
        if b == "context":
            continue
        t.add_row(
            f"decode batch {b} @ ctx {res['decode']['context']} (tok/s)",
            f"{r['engine_tok_s']:.0f}",
            f"{r['hf_tok_s']:.0f}",
            f"{r['ratio']:.2f}x",
        )
    e = res["extend"]
    t.add_row(
        f"extend {e['tokens']} tokens @ ctx {e['context']} (ms)",
        f"{e['extend_ms']:.1f}",
        f"{e['hf_extend_ms']:.1f}",
        "",
    )
    t.add_row(
        f"one decode step @ ctx {e['context']} (ms)",
        f"{e['decode_step_ms']:.1f}",
        f"{e['hf_decode_step_ms']:.1f}",
        f"extend = {e['extend_over_step']:.1f} steps",
    )
    m = res["mixed"]
    t.add_row(
        f"mixed: {m['requests']} requests, batch {m['batch']} (output tok/s)",
        f"{m['engine_tok_s']:.0f}",
        f"{m['hf_tok_s']:.0f}",
        f"{m['ratio']:.2f}x",
    )
    t.add_row(
        "mixed: process CPU seconds",
        f"{m['engine_cpu_s']:.1f}",
        f"{m['hf_cpu_s']:.1f}",
        f"{m['cpu_ratio']:.2f}x",
    )
    tp = res.get("tensor_parallel")
    if tp:
        for n, r in tp["degrees"].items():
            if "skipped" in r:
                t.add_row(f"TP {n}", "skipped", "", r["skipped"])
                continue
            ranks = f"{n} rank{'s' if n != '1' else ''} x {r['threads_per_rank']} threads"
            t.add_row(
                f"TP {n} ({ranks}): prefill {tp['prefill_tokens']} tokens (ms)",
                f"{r['prefill_ms']:.1f}",
                "",
                f"{r['prefill_vs_tp1']:.2f}x TP 1" if "prefill_vs_tp1" in r else "",
            )
            t.add_row(
                f"TP {n}: decode step, batch {tp['decode_batch']} @ ctx "
                f"{tp['decode_context']} (ms)",
                f"{r['decode_step_ms']:.1f}",
                "",
                f"{r['decode_vs_tp1']:.2f}x TP 1" if "decode_vs_tp1" in r else "",
            )
    console().print(t)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    app.command("generate")(generate)
    bench_app.command("engine")(bench_engine)
