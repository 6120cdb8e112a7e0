"""`pddflow size`: capacity planning with the simulator (pddflow/sim/sizing/): the replicas per
operator with the most SLA goodput within a budget, or the cheapest that sustain a target rate;
several graphs side by side, each at its best."""

from __future__ import annotations

import json
import os
from contextlib import nullcontext
from pathlib import Path

import typer

from pddflow.commands.common import GRAPH_HELP, fail, load_or_exit, resolve_or_exit
from pddflow.commands.progress import console, progress_bar


def size(
    graphs: list[Path] = typer.Argument(
        ..., help=f"{GRAPH_HELP}; several: each sized for the same workload, side by side"
    ),
    budget: float | None = typer.Option(
        None,
        "--budget-usd-per-hour",
        min=0.0,
        help="find the replicas with the most SLA goodput costing at most this",
    ),
    target_rps: float | None = typer.Option(
        None,
        "--target-rps",
        min=1e-6,
        help="find the cheapest replicas at which 95% of requests meet the SLA at this rate",
    ),
    workload: str = typer.Option(
        "pdd",
        "--workload",
        help="pdd (PDD's published conditions: 64K context, ~1K output, ~90% hit, 30 rounds), "
        "agentic (simulate's defaults), or trace (with --trace: the Mooncake conversation "
        "trace shipped in pddflow/data/ without it)",
    ),
    trace: Path | None = typer.Option(None, "--trace", help="Mooncake-format JSONL trace"),
    requests: int = typer.Option(
        1000, "--requests", "-n", min=50, help="requests per replay (trace: its first N)"
    ),
    hit_rate: float | None = typer.Option(
        None, "--hit-rate", min=0.0, max=1.0, help="agentic/pdd: target mean prefix hit"
    ),
    start_rps: float | None = typer.Option(
        None,
        "--start-rps",
        min=1e-6,
        help="where the first capacity search starts (default: 4 req/s; trace: its own rate)",
    ),
    precision: float = typer.Option(
        0.05, "--precision", min=0.005, help="relative precision of each capacity search"
    ),
    seed: int = typer.Option(0, "--seed", help="workload and WAN jitter seed"),
    jobs: int = typer.Option(
        0, "--jobs", "-j", min=0, help="worker processes (0: this machine's cores)"
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="directory for the winners' graph files (default: next to the current directory, "
        "<name>_sized.yaml)",
    ),
    cache_dir: Path = typer.Option(
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pddflow" / "size",
        "--cache-dir",
        help="scores cached by (graph, candidate, workload, seed)",
    ),
    no_cache: bool = typer.Option(False, "--no-cache", help="neither read nor write the cache"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output on stdout"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress"),
) -> None:
    """Size each graph's operators with the simulator: replicas within the clusters' device
    counts, each operator's shape among its `choices` (device class, devices per replica), and a
    declared `host_cache` tier's size; the most SLA goodput within the budget (then the most per
    dollar within the search's precision), or the cheapest meeting a target rate. Prints the
    winner, the frontier of candidates evaluated, and writes the winner's graph file."""
    from pddflow.sim.sizing.run import WORKLOADS, SizeOptions, SizingError, size_graphs

    if (budget is None) == (target_rps is None):
        fail("give one of --budget-usd-per-hour and --target-rps", code=2)
    if workload not in WORKLOADS:
        fail(f"unknown workload {workload!r}; use pdd, agentic or trace", code=2)
    opts = SizeOptions(
        budget=budget,
        target_rps=target_rps,
        workload=workload,
        trace=trace,
        requests=requests,
        hit_rate=hit_rate,
        start_rps=start_rps,
        precision=precision,
        seed=seed,
        jobs=jobs or os.cpu_count() or 1,
        out_dir=out or Path("."),
        cache_dir=None if no_cache else cache_dir,
    )
    files = [resolve_or_exit(g) for g in graphs]
    plans = [load_or_exit(g) for g in files]
    err = console(stderr=True)
    with _progress(quiet, err) as prog:

        def track(name: str):
            if prog is None:
                return None
            task = prog.add_task(f"sizing {name}: candidates scored")
            return lambda done, _total: prog.update(
                task, description=f"sizing {name}: {done} candidates scored", completed=done
            )

        try:
            results = size_graphs(files, plans, opts, track)
        except SizingError as exc:
            fail(str(exc))
    if as_json:
        graphs_out = [r.to_dict() for r in results]
        out_json = {"workload": opts.kind, "requests": requests, "seed": seed, "graphs": graphs_out}
        print(json.dumps(out_json, indent=2))
        return
    _print(results, budget, target_rps)


def _gib(host_gib: dict[str, float]) -> str:
    """Host tier per replica of each tiered operator."""
    return ", ".join(f"{n}={g:g}" for n, g in host_gib.items())


def _print(results, budget, target_rps) -> None:
    from rich.table import Table

    con = console()
    for r in results:
        t = Table(
            title=f"{r.graph}: {len(r.evaluated)} candidates scored "
            f"({r.sims} replays, {r.cache_hits} from cache); frontier, goodput vs cost"
        )
        names = list(r.evaluated[0].replicas) if r.evaluated else []
        varied = _varied(r.evaluated)
        rate = "capacity rps" if r.mode == "budget" else "offered rps"
        tier = any(s.host_gib for s in r.evaluated)
        cols = [*names, *(["host GiB"] if tier else [])]
        cols += ["$/h", rate, "SLA %", "goodput rps", "BCR", "TTFT P90", "TTFT P99"]
        for col in cols:
            t.add_column(col, justify="right")
        for s in r.frontier():
            best = r.best is not None and (s.replicas, s.host_gib, s.shapes) == (
                r.best.replicas,
                r.best.host_gib,
                r.best.shapes,
            )
            mark = " *" if best else ""
            t.add_row(
                *[_count(s, n, varied) for n in names],
                *([_gib(s.host_gib)] if tier else []),
                f"{s.cost_per_hour:.1f}",
                f"{s.rps:.2f}",
                f"{100 * s.sla_attainment:.1f}",
                f"{s.slo_goodput_rps:.2f}{mark}",
                f"{s.bcr:.1f}",
                f"{s.ttft_p90_s:.2f}",
                f"{s.ttft_p99_s:.2f}",
            )
        con.print(t)
        errors = [e for s in r.evaluated for e in s.errors]
        if errors:
            con.print(
                f"  {len(errors)} replay(s) failed the simulator's checks (counted as "
                f"misses): {errors[0]}"
            )
        if r.written:
            con.print(f"  winner written to {r.written}")
    if len(results) < 1:
        return
    what = f"budget ${budget:g}/h" if budget is not None else f"target {target_rps:g} req/s"
    t = Table(title=f"each graph at its best ({what})")
    for col in (
        "graph",
        "replicas",
        "$/h",
        "goodput rps",
        "BCR",
        "TTFT P90",
        "TTFT P99",
        "vs first",
    ):
        t.add_column(col, justify="right" if col not in ("graph", "replicas") else "left")
    base = results[0].best
    for r in results:
        s = r.best
        if s is None:
            t.add_row(Path(r.graph).stem, "none meets the SLA", *[""] * 6)
            continue
        vs = f"{s.bcr / base.bcr - 1:+.1%} BCR" if base and base.bcr else ""
        t.add_row(
            Path(r.graph).stem,
            " ".join(f"{n}={_count(s, n, _varied(r.evaluated))}" for n in s.replicas)
            + (f" host GiB {_gib(s.host_gib)}" if s.host_gib else ""),
            f"{s.cost_per_hour:.1f}",
            f"{s.slo_goodput_rps:.2f}",
            f"{s.bcr:.1f}",
            f"{s.ttft_p90_s:.2f}",
            f"{s.ttft_p99_s:.2f}",
            vs,
        )
    con.print(t)


def _varied(scores) -> set[str]:
    """Operators whose shape differs between the candidates (the graph offered choices)."""
    seen: dict[str, set] = {}
    for s in scores:
        for n, (dev, k) in s.shapes.items():
            seen.setdefault(n, set()).add((dev, k))
    return {n for n, v in seen.items() if len(v) > 1}


def _count(s, name: str, varied: set[str]) -> str:
    if name not in varied:
        return str(s.replicas[name])
    dev, k = s.shapes[name]
    return f"{s.replicas[name]}x{k} {dev}"


def _progress(quiet: bool, err):
    return nullcontext() if quiet else progress_bar(err, transient=False)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    app.command("size")(size)
