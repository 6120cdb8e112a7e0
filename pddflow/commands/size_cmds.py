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
    from pddflow.sim.agentic import AgenticConfig, pdd_conditions
    from pddflow.sim.sizing.cache import Cache
    from pddflow.sim.sizing.search import Search, size, write_graph
    from pddflow.sim.sizing.workloads import AgenticSource, trace_source

    if (budget is None) == (target_rps is None):
        fail("give one of --budget-usd-per-hour and --target-rps", code=2)
    if workload not in ("pdd", "agentic", "trace"):
        fail(f"unknown workload {workload!r}; use pdd, agentic or trace", code=2)
    if trace is not None and workload != "trace":
        workload = "trace"
    files = [resolve_or_exit(g) for g in graphs]
    plans = [load_or_exit(g) for g in files]
    block = 512
    if workload == "trace":
        from pddflow.data import MOONCAKE_TRACE
        from pddflow.sim.trace import TraceError

        try:
            source = trace_source(str(trace or MOONCAKE_TRACE), limit=requests)
        except (TraceError, OSError) as exc:
            fail(str(exc))
    else:
        extra = {} if hit_rate is None else {"hit_rate": hit_rate}
        cfg = (
            pdd_conditions(requests=requests, rps=4.0, seed=seed, block_tokens=block, **extra)
            if workload == "pdd"
            else AgenticConfig(requests=requests, rps=4.0, seed=seed, block_tokens=block, **extra)
        )
        source = AgenticSource(cfg)
    start = start_rps or source.base_rps
    jobs = jobs or os.cpu_count() or 1
    results = []
    err = console(stderr=True)
    with _progress(quiet, err) as prog:
        for f, p in zip(files, plans):
            cache = Cache(None if no_cache else cache_dir / f"{p.name}.json")
            task = prog.add_task(f"sizing {p.name}: candidates scored") if prog else None
            tick = (
                (
                    lambda done, _t, k=task, n=p.name: prog.update(
                        k, description=f"sizing {n}: {done} candidates scored", completed=done
                    )
                )
                if prog
                else None
            )
            res = size(
                p,
                lambda plan, c=cache, t=tick: Search(
                    plan, source, seed=seed, jobs=jobs, cache=c, progress=t, precision=precision
                ),
                budget=budget,
                target_rps=target_rps,
                start_rps=start,
            )
            if res.best is not None:
                d = out or Path(".")
                d.mkdir(parents=True, exist_ok=True)
                limit = f"${budget:g}/h" if budget is not None else f"{target_rps:g} req/s"
                path = write_graph(
                    str(f),
                    res.best,
                    d / f"{p.name}_sized.yaml",
                    f"`pddflow size` winner for {limit}, workload {workload}, seed {seed}: "
                    f"{res.best.slo_goodput_rps:.3g} req/s SLA goodput at "
                    f"${res.best.cost_per_hour:g}/h",
                )
                res.written = str(path)
            results.append(res)
    if as_json:
        print(
            json.dumps(
                {
                    "workload": workload,
                    "requests": requests,
                    "seed": seed,
                    "graphs": [r.to_dict() for r in results],
                },
                indent=2,
            )
        )
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
