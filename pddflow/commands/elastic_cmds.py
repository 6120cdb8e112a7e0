"""`pddflow bench elastic`: fixed pools against the planner on one load ramp."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import typer

from pddflow.commands.common import GRAPH_HELP, fail, load_or_exit, resolve_or_exit
from pddflow.commands.deploy_flags import check_engine_profile, cpu_pinning_option, engine_option
from pddflow.commands.progress import console, progress_bar


def bench_elastic(
    graph: Path = typer.Argument(..., help=GRAPH_HELP, show_default=False),
    most: str = typer.Option(
        "3",
        "--max-replicas",
        help="each pool's most replicas (its fewest is 1), or 'declared': each operator's "
        "replicas as the graph declares them (e.g. the 88-GPU graphs' 10 / 2 / 10)",
    ),
    low_rps: float = typer.Option(0.25, min=0.01, help="session starts per second, low phases"),
    peak_rps: float = typer.Option(1.0, min=0.01, help="session starts per second, the peak"),
    phase_s: float = typer.Option(
        60.0, min=5.0, help="seconds of a phase: low for one, the peak for one, low for two"
    ),
    turns: int = typer.Option(2, min=1, help="turns per session"),
    scale: float = typer.Option(1 / 32, min=1e-4, help="built-in model tokens per trace token"),
    max_output: int = typer.Option(64, min=1, help="cap on one turn's output tokens"),
    think: float = typer.Option(1.0, min=0.0, help="seconds between a session's turns"),
    interval: float = typer.Option(2.0, min=0.5, help="the planner's autoscale.interval_s"),
    scale_down_after: float = typer.Option(
        20.0, min=0.0, help="the planner's autoscale.scale_down_after_s"
    ),
    sla_ttft_s: float | None = typer.Option(
        None, min=0.001, help="the SLA's TTFT, s (default: the graph's scheduler.sla)"
    ),
    sla_tpot_ms: float | None = typer.Option(
        None,
        min=0.001,
        help="the SLA's TPOT, ms (default: the graph's; one CPU replica of the built-in model "
        "steps slower than a production SLA's 50 ms once it shares the cores)",
    ),
    modes: str = typer.Option(
        "fixed_min,fixed_max,planner", help="which runs, in order (comma-separated)"
    ),
    timeout: float = typer.Option(120.0, min=1.0, help="deadline of one request, s"),
    seed: int = typer.Option(0, help="workload seed"),
    cpu_pinning: str = cpu_pinning_option("none", passed=True),
    engine: str = engine_option(passed=True),
    time_scale: float = typer.Option(
        1.0,
        min=1e-3,
        help="modeled engine: steps, the SLA, session starts and think time this many times "
        "as long (when this machine's cores cannot keep up with the modeled fleet)",
    ),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Serve one load ramp (low, about 4x, low) of the shipped trace's sessions three ways in one
    run: every pool fixed at 1 replica, fixed at --max-replicas, and sized live by the planner
    (deploy --planner). Reports each run's SLA attainment, device-seconds, errors, replica
    timeline per pool and its direction changes, and checks every answer's tokens against the
    colocated engine's greedy reference (docs/benchmarks.md, Elastic pools)."""
    from pddflow.bench.elastic import MODES
    from pddflow.bench.elastic_run import ElasticError, ElasticOptions, run_elastic

    picked = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in picked if m not in MODES]
    if bad or not picked:
        fail(f"--modes: unknown {', '.join(bad) or '(none)'}; modes: {', '.join(MODES)}", code=2)
    check_engine_profile(engine)
    if engine == "real" and time_scale != 1.0:
        fail("--time-scale slows the modeled engine; add --engine modeled", code=2)
    if most != "declared" and not (most.isdigit() and int(most) >= 2):
        fail(f"--max-replicas: {most!r} is neither a count of 2 or more nor 'declared'", code=2)
    opts = ElasticOptions(
        modes=tuple(picked),
        max_replicas=None if most == "declared" else int(most),
        low_rps=low_rps,
        peak_rps=peak_rps,
        phase_s=phase_s,
        turns=turns,
        scale=scale,
        max_output=max_output,
        think_s=think,
        interval_s=interval,
        scale_down_after_s=scale_down_after,
        sla_ttft_s=sla_ttft_s,
        sla_tpot_ms=sla_tpot_ms,
        timeout_s=timeout,
        seed=seed,
        cpu_pinning=cpu_pinning,
        engine=engine,
        time_scale=time_scale,
    )
    path = resolve_or_exit(graph)
    plan = load_or_exit(path).scaled_to_local()
    err = console(stderr=True)
    signal.signal(signal.SIGTERM, _interrupt)
    with progress_bar(err, counted=True) as bar:

        def track(mode: str, total: int):
            task = bar.add_task(mode, total=total)
            return lambda: bar.advance(task)

        try:
            out = run_elastic(path, opts, plan, track, err.print)
        except ElasticError as exc:
            fail(str(exc))
    if as_json:
        print(json.dumps(out, indent=2))
        return
    for r in out["runs"]:
        err.print(
            f"{r['mode']:>9}: SLA {r['sla_attainment']}, device-s {r['device_seconds']}, "
            f"errors {r['errors']}, wrong tokens {r['token_mismatches']}, direction changes "
            f"{r['direction_changes']}, replicas {r['replicas']}"
        )
    if "planner_vs_fixed_max" in out:
        err.print(f"planner vs fixed_max: {out['planner_vs_fixed_max']}")


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    bench_app.command("elastic")(bench_elastic)
