"""`pddflow simulate`: replay a trace or an agentic workload on one or more graphs, side by side.

numpy and matplotlib are imported inside the command (only --plot and --calibrate need them); the
simulator itself is pure Python.
"""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from pathlib import Path

import typer

from pddflow.commands.common import GRAPH_HELP, check_cpu_pinning, fail, load_or_exit
from pddflow.commands.progress import progress_bar
from pddflow.commands.sim_output import print_results, print_sweep


def simulate(
    graphs: list[Path] = typer.Argument(
        ...,
        help=f"{GRAPH_HELP}; several to compare (same workload, one after the other)",
        show_default=False,
    ),
    trace: Path | None = typer.Option(
        None,
        "--trace",
        help="Mooncake-format JSONL trace to replay (--workload trace without it: the Mooncake "
        "conversation trace shipped in pddflow/data/)",
    ),
    workload: str = typer.Option(
        "auto",
        "--workload",
        help="trace | agentic | pdd | serve (auto: trace when --trace is given; pdd: the agentic "
        "generator at PDD's published conditions, contexts to 64K, ~1K output, 30 rounds, ~90% "
        "hit; --rps, -n, --seed apply)",
    ),
    serve_workload: bool = typer.Option(
        False,
        "--serve-workload",
        help="replay `pddflow bench serve`'s multi-turn sessions exactly (same as "
        "--workload serve; --trace is the trace they derive from)",
    ),
    sessions: int = typer.Option(
        4, "--sessions", min=1, help="serve: sessions (as `bench serve --sessions`)"
    ),
    scale: float = typer.Option(
        1 / 32, "--scale", min=1e-4, help="serve: built-in model tokens per trace token"
    ),
    max_output: int = typer.Option(
        128, "--max-output", min=1, help="serve: cap on one turn's output tokens"
    ),
    wan_gbps: float | None = typer.Option(
        None,
        "--wan-gbps",
        min=1e-6,
        help="every link at this bandwidth instead of the graph's (as "
        "`pddflow deploy/bench serve --wan-gbps`)",
    ),
    cpu_cores: float | None = typer.Option(
        None,
        "--cpu-cores",
        min=0.0,
        help="model every instance sharing this many host cores (one "
        "process each, as the embedded deployment); default: this "
        "machine's cores with --serve-workload and --calibrate, 0 = off",
    ),
    pinning: str = typer.Option(
        "auto",
        "--cpu-pinning",
        help="with the CPU model: how the runtime pins workers (`pddflow deploy --cpu-pinning`)",
    ),
    requests: int | None = typer.Option(
        None,
        "--requests",
        "-n",
        min=1,
        help="requests to replay (trace: the first N; agentic: how many; default 4000)",
    ),
    rate_scale: float = typer.Option(
        1.0, "--rate-scale", min=1e-6, help="trace: multiply the request rate"
    ),
    input_scale: float = typer.Option(
        1.0, "--input-scale", min=1e-6, help="trace: multiply prompt lengths"
    ),
    output_scale: float = typer.Option(
        1.0, "--output-scale", min=1e-6, help="trace: multiply output lengths"
    ),
    rps: float | None = typer.Option(
        None,
        "--rps",
        min=1e-6,
        help="agentic: request rate, default 8 (sessions are closed-loop); "
        "serve: session starts per second, default 2",
    ),
    hit_rate: float = typer.Option(
        0.9, "--hit-rate", min=0.0, max=1.0, help="agentic: target mean prefix hit"
    ),
    turns: float | None = typer.Option(
        None,
        "--turns",
        min=1.0,
        help="agentic: mean tool-call rounds per session (default 12); "
        "serve: turns per session (default 4)",
    ),
    think_s: float | None = typer.Option(
        None,
        "--think-s",
        "--think",
        min=0.0,
        help="agentic: mean gap between a session's turns (default 20 s); "
        "serve: seconds between a turn's answer and the next (default 1)",
    ),
    prompt_tokens: int = typer.Option(
        16000, "--prompt-tokens", min=1, help="agentic: median first-turn context"
    ),
    output_tokens: int = typer.Option(
        400, "--output-tokens", min=1, help="agentic: median output length"
    ),
    seed: int = typer.Option(
        0, "--seed", help="seed for the workload and the WAN jitter (same seed, same result)"
    ),
    sweep: str | None = typer.Option(
        None, "--sweep", help="hit-rate: sweep the agentic hit rate and draw the bathtub"
    ),
    sweep_points: str = typer.Option(
        "0,0.2,0.4,0.5,0.6,0.7,0.8,0.9,0.95",
        "--sweep-points",
        help="hit rates for --sweep hit-rate",
    ),
    cached_price: str = typer.Option(
        "0.1,0.25",
        "--cached-price",
        help="cached-token price as a share of uncached, for the sweep's revenue",
    ),
    sweep_load: str = typer.Option(
        "capacity",
        "--sweep-load",
        help="capacity: each sweep point at its SLA capacity (searched); fixed: at --rps",
    ),
    calibrate: list[Path] | None = typer.Option(
        None,
        "--calibrate",
        help="`pddflow bench engine --json` output: fit the device model "
        "to this machine and simulate the graph's local (embedded) "
        "profile; repeat it to fit the median of several runs. "
        "`pddflow bench serve --json --per-request` output may be "
        "added (with --serve-workload): the deployment's own prefill "
        "and decode CPU, wall over CPU and KV export times",
    ),
    profile: str = typer.Option(
        "auto", "--profile", help="production | local (auto: local with --calibrate)"
    ),
    stream_gbps: float | None = typer.Option(
        None,
        "--stream-gbps",
        min=0.0,
        help="WAN: Gbps one TCP stream sustains on every link, instead of the graph's "
        "declared stream_gbps / window over RTT (a transfer gets streams x this at most; "
        "0 = no cap)",
    ),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output on stdout"),
    per_request: bool = typer.Option(
        False,
        "--per-request",
        help="with --json: every request's session, turn, "
        "start, TTFT, variant and KV transfer (as `bench serve --per-request`)",
    ),
    plot: Path | None = typer.Option(None, "--plot", help="write PNG plots into this directory"),
    replications: int = typer.Option(
        1,
        "--replications",
        min=1,
        help="replay the same workload N times with other draws of the random "
        "parts (WAN jitter, the deployment calibration's prefill spread) and "
        "report each TTFT/TPOT percentile as the median over them",
    ),
    check_mirrors: bool = typer.Option(
        False,
        "--check-mirrors",
        help="compare every scheduler mirror with its cache after every event (slow)",
    ),
    planner: bool = typer.Option(
        False,
        "--planner",
        help="pools follow the load: the graph's autoscale: planner resizes each operator within "
        "autoscale.min_replicas..replicas every interval_s (new replicas serve startup_s later); "
        "reports device-hours, the decisions and each pool's replica timeline",
    ),
    arrival_profile: str | None = typer.Option(
        None,
        "--arrival-profile",
        help="re-time the workload's arrivals: diurnal[:R] (one day's cycle over the workload, "
        "its middle R times busier than its ends, default 4) or T:M,T:M,... (the rate times M "
        "from T s on, e.g. 0:1,600:4,1200:1)",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
) -> None:
    """Simulate graphs at cluster scale with the same Plan and scheduler the runtime uses: TTFT/TPOT
    percentiles, SLA goodput, cost, BCR, WAN bytes, relay token share, variants and handoffs."""
    from pddflow.sim.runner import RunOptions, simulate_each
    from pddflow.sim.workload_options import WorkloadOptions

    kind = _kind(workload, serve_workload, trace)
    arrivals = _checked(kind, trace, profile, sweep, sweep_load, pinning, planner, arrival_profile)
    spec = WorkloadOptions(
        kind=kind,
        seed=seed,
        trace=trace,
        requests=requests,
        rate_scale=rate_scale,
        input_scale=input_scale,
        output_scale=output_scale,
        rps=rps,
        turns=turns,
        think_s=think_s,
        hit_rate=hit_rate,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        sessions=sessions,
        scale=scale,
        max_output=max_output,
        arrivals=arrivals,
    )
    measured = _measurements(calibrate, kind) if calibrate else None
    local = profile == "local" or (profile == "auto" and measured is not None)
    plans, cals = _fleet(graphs, wan_gbps, stream_gbps, measured, local, kind, cpu_cores, pinning,
                         sweep)  # fmt: skip
    # a local (embedded) profile runs the small built-in model: hash prompts at its block size
    model = plans[0].model
    block = model.block_size if local else 512
    if sweep:
        base = spec.agentic(block, model.max_context)
        out = _sweep(plans, cals, base, sweep_points, cached_price, seed, check_mirrors, quiet,
                     sweep_load)  # fmt: skip
        print_sweep(out, as_json, plot)
        return
    options = RunOptions(
        seed=seed,
        replications=replications,
        strict_mirrors=check_mirrors,
        # compared with the runtime: its worker loop, and its WAN delays (`bench serve` deploys
        # with the default --seed 0)
        embedded=kind == "serve",
        wan_jitter_seed=0 if kind == "serve" else None,
        planner=planner,
    )
    try:
        wl = spec.build(block, model.max_context, model.block_size)
        with _progress(quiet) as prog:
            track = (lambda name, n: _tracker(prog, f"simulating {name}", n)) if prog else None
            results, sims = simulate_each(
                plans, cals, wl, options, per_request=per_request, measured=measured, track=track
            )
    except ValueError as exc:  # WorkloadError is one; so is a plan the simulator refuses
        fail(str(exc))
    if plot is not None:
        _plots(plot, sims)
    print_results(results, wl, as_json)


def _fleet(graphs, wan_gbps, stream_gbps, measured, local, kind, cpu_cores, pinning, sweep):
    """The graphs' plans as simulated (links as the options say, fit to `measured` or scaled to
    the local profile) and their calibrations."""
    from pddflow.sim.calibration import HostSpec
    from pddflow.sim.runner import prepared, with_stream_gbps, with_wan_gbps

    if cpu_cores is None and kind == "serve" and measured is not None and local:
        cpu_cores = float(os.cpu_count() or 1)
    # one process per instance, on the cores the runtime would pin it to
    host = HostSpec(cpu_cores, pinning) if cpu_cores and not sweep else None
    plans = [
        with_stream_gbps(with_wan_gbps(load_or_exit(g), wan_gbps), stream_gbps) for g in graphs
    ]
    return prepared(plans, measured, local, host)


def _checked(kind, trace, profile, sweep, sweep_load, pinning, planner, arrival_profile):
    """The options' values and combinations refused (exit 2); the arrival profile parsed."""
    if profile not in ("auto", "production", "local"):
        fail(f"unknown profile {profile!r}; use production or local", code=2)
    if sweep is not None and sweep != "hit-rate":
        fail(f"unknown sweep {sweep!r}; the sweep is `--sweep hit-rate`", code=2)
    if sweep and kind in ("serve", "trace"):
        drop = {"serve": "--serve-workload", "trace": "--trace" if trace else "--workload trace"}
        fail(f"--sweep hit-rate generates agentic workloads; drop {drop[kind]}", code=2)
    if sweep and sweep_load not in ("capacity", "fixed"):
        fail(f"unknown --sweep-load {sweep_load!r}; use capacity or fixed", code=2)
    check_cpu_pinning(pinning)
    arrivals = _arrival_profile(arrival_profile)
    if sweep and (planner or arrivals):
        fail("--sweep hit-rate runs fixed fleets at fixed rates; drop --planner and "
             "--arrival-profile", code=2)  # fmt: skip
    return arrivals


def _kind(workload: str, serve_workload: bool, trace: Path | None) -> str:
    """--workload (auto: trace with --trace, else agentic) and --serve-workload as one kind."""
    if workload not in ("auto", "trace", "agentic", "pdd", "serve"):
        fail(f"unknown workload {workload!r}; use trace, agentic, pdd or serve", code=2)
    if serve_workload:
        if workload not in ("auto", "serve"):
            fail(f"--serve-workload contradicts --workload {workload}", code=2)
        return "serve"
    kind = workload if workload != "auto" else ("trace" if trace else "agentic")
    if kind in ("agentic", "pdd") and trace is not None:
        fail(f"--workload {kind} generates its own requests; drop --trace", code=2)
    return kind


def _tracker(prog, description: str, total: int):
    task = prog.add_task(description, total=total)
    return lambda done, _total: prog.update(task, completed=done)


def _arrival_profile(text: str | None):
    if text is None:
        return None
    from pddflow.sim.arrival_profile import ProfileError, parse_profile

    try:
        return parse_profile(text)
    except ProfileError as exc:
        fail(str(exc), code=2)


def _measurements(calibrate: list[Path], kind: str):
    """The `--calibrate` files: engine benchmarks, and bench serve reports of a serve workload."""
    from pddflow.sim.calibration import CalibrationError, Measurements, is_serve_report

    serve_files = [c for c in calibrate if is_serve_report(c)]
    engine_files = [c for c in calibrate if c not in serve_files]
    named = ", ".join(map(str, serve_files))
    if not engine_files:
        fail(
            f"{named}: `pddflow bench serve` output calibrates the deployment on top of an engine "
            f"fit; also pass `pddflow bench engine --json` output with --calibrate",
            code=2,
        )
    if serve_files and kind != "serve":
        fail(
            f"{named}: a `pddflow bench serve` report calibrates the replay of its workload on the "
            f"embedded deployment; add --serve-workload, or drop it from --calibrate",
            code=2,
        )
    try:
        return Measurements.load(engine_files, serve_files)
    except CalibrationError as exc:
        fail(str(exc))


def _progress(quiet: bool):
    if quiet:
        return nullcontext()
    from rich.console import Console

    return progress_bar(Console(stderr=True), counted=True, transient=False)


def _plots(directory: Path, sims) -> None:
    from pddflow.sim.plots import ttft_cdf, variant_timeline

    directory.mkdir(parents=True, exist_ok=True)
    written = [ttft_cdf(sims, directory / "ttft_cdf.png")]
    for s in sims:
        written.append(variant_timeline(s, directory / f"timeline_{s.plan.name}.png"))
    for w in written:
        print(f"wrote {w}", file=sys.stderr)


def _sweep(plans, cals, base, points, cached_price, seed, check_mirrors, quiet, load) -> list[dict]:
    from pddflow.sim.sweep import hit_rate_sweep

    try:
        hits = [float(x) for x in points.split(",") if x.strip()]
        prices = [float(x) for x in cached_price.split(",") if x.strip()]
    except ValueError:
        fail(
            "--sweep-points and --cached-price take comma-separated numbers, e.g. 0,0.5,0.9", code=2
        )
    if (
        not hits
        or any(not 0 <= h <= 1 for h in hits)
        or not prices
        or any(not 0 <= r <= 1 for r in prices)
    ):
        fail("--sweep-points and --cached-price must be numbers in [0, 1]", code=2)
    out = []
    with _progress(quiet) as prog:
        for p, cal in zip(plans, cals):
            task = (
                prog.add_task(f"simulating {p.name} hit-rate sweep", total=len(hits))
                if prog
                else None
            )
            rows = hit_rate_sweep(
                p,
                base,
                hits,
                prices,
                seed,
                {"strict_mirrors": check_mirrors, "calibration": cal},
                (lambda d, t, k=task: prog.update(k, completed=d)) if prog else None,
                load,
            )
            out.append(
                {
                    "graph": p.name,
                    "gpus": sum(o.replicas * o.devices_per_replica for o in p.operators.values()),
                    "cost_per_hour": round(p.cost_per_hour(), 3),
                    "load": load,
                    "points": rows,
                }
            )
    return out


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    app.command("simulate")(simulate)
