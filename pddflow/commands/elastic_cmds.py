"""`pddflow bench elastic`: fixed pools against the planner on one load ramp."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import typer

from pddflow.commands.common import (
    GRAPH_HELP,
    check_cpu_pinning,
    fail,
    load_or_exit,
    resolve_or_exit,
)
from pddflow.commands.progress import console, progress_bar
from pddflow.data import MOONCAKE_TRACE
from pddflow.runtime.deploy.modeled import ENGINES


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
    cpu_pinning: str = typer.Option("none", help="passed to every `pddflow deploy`"),
    engine: str = typer.Option(
        "real",
        help="passed to every `pddflow deploy`: real (the built-in model on this machine's "
        "cores, where replicas share them) or modeled (each replica takes the device model's "
        "time on devices of its own; docs/runtime.md, The modeled engine)",
    ),
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
    import tempfile

    from pddflow.bench.deploy_process import LaunchError
    from pddflow.bench.elastic import (
        MODES,
        elastic_graph,
        ramp_starts,
        reference_mismatches,
        run_mode,
        summarize,
    )
    from pddflow.core.serve_sessions import TraceError, build

    check_cpu_pinning(cpu_pinning)
    picked = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in picked if m not in MODES]
    if bad or not picked:
        fail(f"--modes: unknown {', '.join(bad) or '(none)'}; modes: {', '.join(MODES)}", code=2)
    if engine not in ENGINES:
        fail(f"--engine: unknown {engine!r}; engines: {', '.join(ENGINES)}", code=2)
    if engine == "real" and time_scale != 1.0:
        fail("--time-scale slows the modeled engine; add --engine modeled", code=2)
    if most != "declared" and not (most.isdigit() and int(most) >= 2):
        fail(f"--max-replicas: {most!r} is neither a count of 2 or more nor 'declared'", code=2)
    bound = None if most == "declared" else int(most)
    path = resolve_or_exit(graph)
    plan = load_or_exit(path).scaled_to_local()
    ttft_s = sla_ttft_s or plan.scheduler.ttft_s
    tpot_ms = sla_tpot_ms or plan.scheduler.tpot_ms
    # the deployment's SLA, as its time runs: what the planner holds and attainment counts
    sla_over = {"ttft_s": ttft_s * time_scale, "tpot_ms": tpot_ms * time_scale}
    starts = [t * time_scale for t in ramp_starts(low_rps, peak_rps, phase_s)]
    try:
        from pddflow.operators.hub import resolve_model
        from pddflow.runtime.frontend.model_info import model_info

        weights = resolve_model(plan.model.weights)
        vocab = model_info(weights).vocab_size
        workload = build(
            MOONCAKE_TRACE, len(starts), turns, scale, min(vocab, 256), seed, max_output
        )
    except (TraceError, OSError) as exc:
        fail(str(exc))
    # devices an instance holds: a modeled one stands for a whole production replica
    ranks = {
        n: op.devices_per_replica if engine == "modeled" else op.ranks
        for n, op in plan.operators.items()
    }
    autoscale = {
        "interval_s": interval * time_scale,
        "scale_down_after_s": scale_down_after * time_scale,
    }
    deploy_args = ("--cpu-pinning", cpu_pinning, "--engine", engine)
    if engine == "modeled":
        deploy_args += ("--time-scale", str(time_scale))
    err = console(stderr=True)
    signal.signal(signal.SIGTERM, _interrupt)
    runs = []
    with tempfile.TemporaryDirectory(prefix="pddflow-elastic-graphs-") as gd:
        with progress_bar(err, counted=True) as bar:
            for mode in picked:
                g = elastic_graph(path, mode, bound, autoscale, Path(gd), sla_over)
                task = bar.add_task(f"{mode}", total=workload.requests)
                try:
                    runs.append(
                        run_mode(
                            mode,
                            g,
                            ranks,
                            workload,
                            starts,
                            think * time_scale,
                            timeout * time_scale,
                            lambda t=task: bar.advance(t),
                            deploy_args,
                        )  # fmt: skip
                    )
                except LaunchError as exc:
                    fail(f"{path} ({mode}): {exc}")
    err.print("checking every answer against the colocated engine's greedy tokens")
    wrong = reference_mismatches(str(weights), runs, engine=engine)
    ttft_run, tpot_run = sla_over["ttft_s"], sla_over["tpot_ms"] / 1e3
    rows = [summarize(r, ttft_run, tpot_run, wrong[r.mode]) for r in runs]
    out = {
        "graph": str(path),
        "engine": engine,
        "time_scale": time_scale,
        "workload": {
            "sessions": len(starts),
            "turns": turns,
            "requests": workload.requests,
            "low_rps": low_rps,
            "peak_rps": peak_rps,
            "phase_s": phase_s,
            "max_replicas": most,
            "autoscale": autoscale,
            "sla": {"ttft_s": ttft_s, "tpot_ms": tpot_ms},
        },
        "runs": rows,
    }
    by = {r["mode"]: r for r in rows}
    if "fixed_max" in by and "planner" in by and by["fixed_max"]["device_seconds"]:
        p, m = by["planner"], by["fixed_max"]
        out["planner_vs_fixed_max"] = {
            "sla_attainment_points": round(
                100 * ((p["sla_attainment"] or 0) - (m["sla_attainment"] or 0)), 2
            ),
            "device_seconds_ratio": round(p["device_seconds"] / m["device_seconds"], 4),
        }
    if as_json:
        print(json.dumps(out, indent=2))
        return
    for r in rows:
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
