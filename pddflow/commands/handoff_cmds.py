"""`pddflow bench handoff`: a relay -> main handoff as token IDs vs as incremental KV, through the
graph's emulated link (`pddflow/bench/handoff.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from pddflow.commands.common import GRAPH_HELP, fail, load_or_exit


def bench_handoff(
    graph: Path = typer.Argument(Path("pdd"), help=GRAPH_HELP),
    tokens: int = typer.Option(100, "--tokens", min=1, help="tokens handed off per handoff"),
    rounds: int = typer.Option(
        30, "--rounds", min=1, help="measured handoffs per path, after two warm-up rounds"
    ),
    seed: int = typer.Option(0, "--seed", help="seed of the link's jitter and of the token IDs"),
    context: int = typer.Option(
        1024,
        "--context",
        min=1,
        help="prompt tokens main holds before the handoff (a multiple of the block size)",
    ),
    model: str | None = typer.Option(
        None, "--model", help="serve this model instead of the graph's model.weights"
    ),
    threads: int = typer.Option(
        1,
        "--threads",
        min=1,
        help="torch threads of main's engine (more than the free cores stalls its extend)",
    ),
    main_clock: str = typer.Option(
        "cpu",
        "--main-clock",
        help="how main's extend (or KV landing) is timed: cpu, its thread's CPU time, as on a core "
        "of its own; wall, as it happened here, neighbours' load included (both are reported)",
    ),
    jitter_token_ids: bool = typer.Option(
        False,
        "--jitter-token-ids",
        help="draw the link's jitter for token IDs too; the runtime and the simulator give small "
        "messages the RTT only (jitter models bulk KV queueing on a busy WAN)",
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
) -> None:
    """PDD's handoff micro-benchmark: --tokens generated tokens handed from relay to main as
    token IDs (token_ids + main's extend) vs as their KV (wan_flight), through the graph's
    emulated link; bytes, mean, P99, max and std of each, side by side."""
    from rich.console import Console

    from pddflow.bench.handoff import HandoffBenchError, HandoffOptions, run_handoff_bench
    from pddflow.channels.errors import ChannelError
    from pddflow.commands.progress import progress_bar
    from pddflow.core.model_config import ModelSpecError

    plan = load_or_exit(graph)
    opts = HandoffOptions(
        tokens=tokens,
        rounds=rounds,
        seed=seed,
        context=context,
        model=model,
        jitter_token_ids=jitter_token_ids,
        threads=threads,
        main_clock=main_clock,
    )
    err = Console(stderr=True)
    with progress_bar(err, counted=True) as bar:
        task = bar.add_task("starting", total=None)

        def progress(msg: str, done: int, total: int) -> None:
            bar.update(task, description=msg, completed=done, total=total)

        try:
            res = run_handoff_bench(plan, opts, progress)
        except (HandoffBenchError, ModelSpecError) as exc:
            fail(str(exc), code=2)
        except ChannelError as exc:  # a channel could not start or a handoff did not arrive
            fail(f"handoff failed: {exc}")
    if as_json:
        print(json.dumps(res, indent=2))
        return
    _table(res)


def _table(res: dict) -> None:
    from pddflow.commands.progress import console
    from pddflow.commands.tables import metric_table

    link = res["link"]
    jit = link["jitter"]
    title = (
        f"{res['tokens']}-token handoff, {res['graph']} link {link['name']}: "
        f"{link['gbps']:g} Gbps, rtt {link['rtt_ms']:g} ms, "
        f"jitter {jit['dist']} P50 {jit['p50_ms']:g} / P99 {jit['p99_ms']:g} ms "
        f"({res['rounds']} rounds, {res['model']})"
    )
    tok_jitter = "link jitter" if link["on_token_ids"] else "RTT, no jitter"
    rows = [
        ("bytes on the wire", lambda r: f"{r['bytes']:,}"),
        ("mean (ms)", lambda r: f"{r['mean_ms']:.1f}"),
        ("P99 (ms)", lambda r: f"{r['p99_ms']:.1f}"),
        ("max (ms)", lambda r: f"{r['max_ms']:.1f}"),
        ("std (ms)", lambda r: f"{r['std_ms']:.1f}"),
        ("link: mean / std (ms)", lambda r: f"{r['link_mean_ms']:.1f} / {r['link_std_ms']:.1f}"),
        (
            f"main ({res['main_clock']}): mean / std (ms)",
            lambda r: f"{r['main_mean_ms']:.1f} / {r['main_std_ms']:.1f}",
        ),
        (
            "all wall clock: mean / std (ms)",
            lambda r: f"{r['wall_mean_ms']:.1f} / {r['wall_std_ms']:.1f}",
        ),
    ]
    out = console()
    out.print(
        metric_table(
            title,
            [f"token_ids + extend ({tok_jitter})", "kv (wan_flight)"],
            [res["token_ids"], res["kv"]],
            rows,
        )
    )
    prod = res["production"]
    pdd = res["pdd_published"]
    tok, kv = pdd["token_ids"], pdd["kv"]
    out.print(
        f"  KV of the graph's production model ({prod['arch']}) for this handoff: "
        f"{prod['kv_bytes'] / 1024:,.0f} KB"
    )
    out.print(
        f"  PDD measured: token IDs {tok['bytes'] / 1024:.1f} KB, {tok['mean_ms']:g} ms mean, "
        f"{tok['max_ms']:g} ms max, {tok['std_ms']:g} ms std; KV {kv['bytes'] / 1024:,.0f} KB, "
        f"{kv['mean_ms']:g} ms mean, {kv['max_ms']:g} ms max"
    )
    ratios = res["ratios"]
    out.print(
        f"  token_ids / kv: bytes {ratios['bytes']:.2e} (1/{1 / ratios['bytes']:,.0f}), "
        f"std {ratios['std']:.3f}"
    )
    for name, ok in res["targets"].items():
        out.print(f"  {'[green]met[/]' if ok else '[red]missed[/]'}  {name}")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    bench_app.command("handoff")(bench_handoff)
