"""`pddflow simulate`: replay a trace or an agentic workload on one or more graphs, side by side.

numpy and matplotlib are imported inside the command (only --plot needs them); the simulator
itself is pure Python.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import typer

from pddflow.commands.common import check_cpu_pinning, fail, load_or_exit


def simulate(
    graphs: list[Path] = typer.Argument(
        ..., help="graph files to compare (same workload, one after the other)", show_default=False
    ),
    trace: Path | None = typer.Option(
        None, "--trace", help="Mooncake-format JSONL trace to replay"
    ),
    workload: str = typer.Option(
        "auto", "--workload", help="trace | agentic | serve (auto: trace when --trace is given)"
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
    cpu_background: float = typer.Option(
        0.0,
        "--cpu-background",
        min=0.0,
        help="with the CPU model: other tenants' runnable threads on those cores "
        "(assumed the same during the calibration benchmark)",
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
        "added: the deployment's own prefill CPU and the serving "
        "path's CPU per token (frontend, client) on this machine",
    ),
    profile: str = typer.Option(
        "auto", "--profile", help="production | local (auto: local with --calibrate)"
    ),
    stream_gbps: float | None = typer.Option(
        None,
        "--stream-gbps",
        min=0.0,
        help="WAN: Gbps one TCP stream sustains (a transfer gets streams x "
        "this at most; 0 = no cap)",
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
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
) -> None:
    """Simulate graphs at cluster scale with the same Plan and scheduler the runtime uses: TTFT/TPOT
    percentiles, SLA goodput, cost, BCR, WAN bytes, relay token share, variants and handoffs."""
    from pddflow.sim.agentic import AgenticConfig, generate
    from pddflow.sim.calibrate import (
        CalibrationError,
        calibrated_plan,
        fit,
        is_serve_report,
        load_bench,
        load_serve,
        merge,
    )
    from pddflow.sim.network import STREAM_GBPS
    from pddflow.sim.trace import TraceError, load_trace

    if workload not in ("auto", "trace", "agentic", "serve"):
        fail(f"unknown workload {workload!r}; use trace, agentic or serve", code=2)
    if serve_workload:
        if workload not in ("auto", "serve"):
            fail(f"--serve-workload contradicts --workload {workload}", code=2)
        workload = "serve"
    if profile not in ("auto", "production", "local"):
        fail(f"unknown profile {profile!r}; use production or local", code=2)
    if sweep is not None and sweep != "hit-rate":
        fail(f"unknown sweep {sweep!r}; the sweep is `--sweep hit-rate`", code=2)
    kind = workload if workload != "auto" else ("trace" if trace else "agentic")
    if kind == "serve" and sweep:
        fail("--sweep hit-rate generates agentic workloads; drop --serve-workload", code=2)
    if kind == "trace" and trace is None:
        fail("--workload trace needs --trace FILE", code=2)
    if kind == "agentic" and trace is not None:
        fail("--workload agentic generates its own requests; drop --trace", code=2)
    if sweep and trace:
        fail("--sweep hit-rate generates agentic workloads; drop --trace", code=2)

    plans = [load_or_exit(g) for g in graphs]
    if wan_gbps is not None:
        from dataclasses import replace as _replace

        plans = [
            _replace(p, links={n: _replace(link, gbps=wan_gbps) for n, link in p.links.items()})
            for p in plans
        ]
    cal, serve = None, None
    if calibrate:
        serve_files = [c for c in calibrate if is_serve_report(c)]
        engine_files = [c for c in calibrate if c not in serve_files]
        if not engine_files:
            fail(
                f"{', '.join(map(str, serve_files))}: `pddflow bench serve` output calibrates the deployment on "
                f"top of an engine fit; also pass `pddflow bench engine --json` output with --calibrate",
                code=2,
            )
        if serve_files and kind != "serve":
            fail(
                f"{', '.join(map(str, serve_files))}: a `pddflow bench serve` report calibrates the replay of its "
                f"workload on the embedded deployment; add --serve-workload, or drop it from --calibrate",
                code=2,
            )
        try:
            cal = fit(merge([load_bench(c) for c in engine_files]))
            serve = load_serve(serve_files) if serve_files else None
        except CalibrationError as exc:
            fail(str(exc))
    local = profile == "local" or (profile == "auto" and cal is not None)
    # each graph's deployment may have measured its own prefill CPU and serving load (bench serve)
    cals = [cal.for_graph(serve, p.source) for p in plans] if cal is not None else []
    if cal is not None:
        plans = [calibrated_plan(p, c, local=local) for p, c in zip(plans, cals)]
    elif local:
        plans = [p.scaled_to_local() for p in plans]
    sim_kwargs = {
        "stream_gbps": STREAM_GBPS if stream_gbps is None else stream_gbps,
        "strict_mirrors": check_mirrors,
    }
    if cal is not None:
        sim_kwargs["efficiency"] = cal.efficiency

    check_cpu_pinning(pinning)
    if cpu_cores is None and kind == "serve" and cal is not None and local:
        import os

        cpu_cores = float(os.cpu_count() or 1)
    if cpu_cores and not sweep:
        sim_kwargs["cpu_cores"] = cpu_cores
        sim_kwargs["bench_threads"] = cal.facts.threads if cal is not None else 1
        # the co-run point is a benchmark's guess at what the other workers cost a step; a bench
        # serve calibration measured the deployment's own prefills, which supersedes it
        if cal is not None and cal.facts.corun is not None and serve is None:
            sim_kwargs["corun"] = cal.facts.corun
        sim_kwargs["cpu_background"] = cpu_background
        sim_kwargs["cpu_pinning"] = pinning

    # a local (embedded) profile runs the small built-in model: hash prompts at the plan's block size
    block = plans[0].model.block_size if local else 512
    if kind == "serve":
        rps = 2.0 if rps is None else rps
        turns = 4.0 if turns is None else turns
        think_s = 1.0 if think_s is None else think_s
    rps = 8.0 if rps is None else rps
    turns = 12.0 if turns is None else turns
    think_s = 20.0 if think_s is None else think_s
    base = AgenticConfig(
        requests=requests or 4000,
        rps=rps,
        hit_rate=hit_rate,
        turns_mean=turns,
        think_s=think_s,
        first_prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        seed=seed,
        system_prompt_tokens=min(2048, prompt_tokens // 8),
        block_tokens=block,
        max_context=min(65536, plans[0].model.max_context),
    )
    if sweep:
        if sweep_load not in ("capacity", "fixed"):
            fail(f"unknown --sweep-load {sweep_load!r}; use capacity or fixed", code=2)
        _sweep(
            plans,
            base,
            sweep_points,
            cached_price,
            seed,
            sim_kwargs,
            as_json,
            plot,
            quiet,
            sweep_load,
        )
        return

    try:
        if kind == "serve":
            # compared with the runtime: its first-token path,
            sim_kwargs["prefill_first_token"] = True
            sim_kwargs["exclusive_jobs"] = True  # its one model call at a time
            # and its WAN delays: `bench serve` deploys with the default --seed 0
            sim_kwargs["wan_jitter_seed"] = 0
            from pddflow.core.serve_sessions import TraceError as SessionTraceError
            from pddflow.sim.serve_replay import DEFAULT_TRACE
            from pddflow.sim.serve_replay import serve_workload as serve_wl

            try:
                wl = serve_wl(
                    trace or DEFAULT_TRACE,
                    sessions,
                    int(turns),
                    plans[0].model.block_size,
                    scale=scale,
                    seed=seed,
                    max_output=max_output,
                    rps=rps,
                    think_s=think_s,
                )
            except (SessionTraceError, OSError) as exc:
                fail(str(exc))
        elif kind == "trace":
            wl = load_trace(
                trace,
                rate_scale=rate_scale,
                input_scale=input_scale,
                output_scale=output_scale,
                limit=requests,
            )
        else:
            wl = generate(base)
    except TraceError as exc:
        fail(str(exc))
    # per plan: its calibration's prefill costs and (a deployment calibration, replaying bench serve)
    # its prefills' measured spread and its serving path's CPU
    per_plan = (
        [
            {
                "efficiency": c.efficiency,
                "prefill_spread": c.prefill_spread,
                "prefill_size_trend": c.prefill_size_trend,
                "relay_handovers": c.relay_handovers,
                "relay_handovers_queued": c.relay_handovers_queued,
                "prefill_shipping": c.prefill_shipping,
                "serving_cpu_per_token": c.serving_cpu_per_token_s,
                "decode_wall_over_cpu": c.decode_wall_ratios,
                "prefill_wall_over_cpu": c.prefill_wall_ratios,
                "serving_latency_s": c.serving_latency_s,
            }
            for c in cals
        ]
        if cals
        else None
    )
    results, sims = _run_all(plans, wl, seed, sim_kwargs, quiet, per_plan, replications)
    if per_request:
        from pddflow.sim.metrics import request_rows

        for r, sim in zip(results, sims):
            r["per_request"] = request_rows(sim)
    for r in results:
        r["workload"] = {
            "name": wl.name,
            **{k: v for k, v in wl.meta.items() if isinstance(v, (int, float, str))},
        }
    for r, c in zip(results, cals):
        r["calibration"] = c.to_dict()
    for r, sim in zip(results, sims):
        if sim.cpu is not None:
            r["cpu_share"] = sim.cpu.to_dict()
    if plot is not None:
        _plots(plot, sims)
    if as_json:
        out = (
            results[0]
            if len(results) == 1
            else {"graphs": results, "ratios_vs_first": _ratios(results)}
        )
        print(json.dumps(out, indent=2, default=_json_default))
        return
    _print_table(results, wl)


WALL_KINDS = (
    "decode",
    "prefill",
)  # steps whose measured wall over CPU a deployment calibration settles


def _run_all(plans, wl, seed, sim_kwargs, quiet, per_plan=None, replications=1):
    from pddflow.sim.metrics import summarize
    from pddflow.sim.serve_replay import (
        SERVING_ROUNDS,
        SERVING_TOLERANCE,
        serving_load,
        wall_factors,
    )
    from pddflow.sim.simulator import HostCpus, Simulation

    results, sims = [], []
    sim_kwargs = dict(sim_kwargs)
    cores = sim_kwargs.pop("cpu_cores", None)
    bench_threads = sim_kwargs.pop("bench_threads", 1)
    background = sim_kwargs.pop("cpu_background", 0.0)
    pinning = sim_kwargs.pop("cpu_pinning", "auto")
    corun = sim_kwargs.pop("corun", (1.0, 1.0))
    with _progress(quiet) as prog:
        for i, p in enumerate(plans):
            kw = dict(sim_kwargs, **(per_plan[i] if per_plan else {}))
            per_token = kw.pop("serving_cpu_per_token", 0.0)
            # measured wall over CPU per kind of step and instance
            measured = {kind: kw.pop(f"{kind}_wall_over_cpu", {}) for kind in WALL_KINDS}
            if not cores:  # a wall-time term needs the host model
                measured = {kind: {} for kind in WALL_KINDS}
            task = prog.add_task(f"{p.name}", total=len(wl.requests)) if prog else None

            def replay(
                serving: float, sim_seed: int, walls: dict[str, dict[str, float]]
            ) -> Simulation:
                # one process per instance, on the cores the runtime would pin it to
                cpu = (
                    HostCpus(
                        p, cores, bench_threads, background, pinning, corun=corun, serving=serving
                    )
                    if cores
                    else None
                )
                sim = Simulation(
                    p,
                    wl,
                    seed=sim_seed,
                    cpu=cpu,
                    decode_wall_factors=walls["decode"],
                    prefill_wall_factors=walls["prefill"],
                    **kw,
                )
                try:
                    sim.run(
                        progress=(lambda done, total, t=task: prog.update(t, completed=done))
                        if prog
                        else None
                    )
                except ValueError as exc:
                    fail(f"{p.source}: {exc}")
                return sim

            # the serving path's load follows the token rate, which follows the load, and the wall
            # factors follow the host model's share of the measured wall: replay until all settle
            # (a few rounds; each replay of a serve workload takes well under a second)
            serving, walls, rounds = 0.0, {kind: {} for kind in WALL_KINDS}, 0
            while True:
                sim = replay(serving, seed, walls)
                rounds += 1
                want = serving_load(sim, per_token) if cores and per_token else 0.0
                want_walls = {
                    kind: wall_factors(sim, kind, measured[kind], walls[kind])
                    for kind in WALL_KINDS
                }
                settled = abs(want - serving) <= SERVING_TOLERANCE * max(want, 1e-9) and all(
                    abs(f - walls[kind].get(i, 1.0)) <= SERVING_TOLERANCE * f
                    for kind in WALL_KINDS
                    for i, f in want_walls[kind].items()
                )
                if settled or rounds >= SERVING_ROUNDS:
                    break
                serving, walls = want, want_walls
            result = summarize(sim)
            if replications > 1:  # the same workload, other draws of the random parts
                result = _pool(
                    [result]
                    + [summarize(replay(serving, seed + r, walls)) for r in range(1, replications)]
                )
            if cores and per_token:
                result["serving_load"] = {
                    "cpu_ms_per_token": round(per_token * 1e3, 4),
                    "cores": round(serving, 4),
                    "replays": rounds,
                }
            for kind in WALL_KINDS:
                if measured[kind]:
                    simulated = {
                        i: getattr(e, f"{kind}_wall_over_model") for i, e in sim.engines.items()
                    }
                    result[f"{kind}_wall"] = {
                        i: {
                            "measured_wall_over_cpu": round(r, 4),
                            "simulated_wall_over_model": None
                            if simulated.get(i) is None
                            else round(simulated[i], 4),
                            "factor": round(walls[kind].get(i, 1.0), 4),
                        }
                        for i, r in sorted(measured[kind].items())
                    }
            results.append(result)
            sims.append(sim)
    return results, sims


def _pool(results: list[dict]) -> dict:
    """Replications of one graph as one result: the first's, with every TTFT and TPOT percentile
    the median over the replications (each kept under `replications`)."""
    import statistics

    out = dict(results[0])
    for key in ("ttft_s", "tpot_ms"):
        out[key] = {
            q: round(statistics.median(r[key][q] for r in results), 4)
            for q in ("p50", "p90", "p99")
        }
    out["replications"] = {
        "n": len(results),
        **{
            f"{key}_{q}": [r[key][q] for r in results]
            for key in ("ttft_s", "tpot_ms")
            for q in ("p50", "p90")
        },
    }
    return out


class _NoProgress:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def _progress(quiet: bool):
    if quiet:
        return _NoProgress()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("simulating {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    )


def _plots(directory: Path, sims) -> None:
    from pddflow.sim.plots import ttft_cdf, variant_timeline

    directory.mkdir(parents=True, exist_ok=True)
    written = [ttft_cdf(sims, directory / "ttft_cdf.png")]
    for s in sims:
        written.append(variant_timeline(s, directory / f"timeline_{s.plan.name}.png"))
    for w in written:
        print(f"wrote {w}", file=sys.stderr)


def _sweep(plans, base, points, cached_price, seed, sim_kwargs, as_json, plot, quiet, load) -> None:
    from pddflow.sim.sweep import hit_rate_sweep

    try:
        hits = [float(x) for x in points.split(",") if x.strip()]
        ratios = [float(x) for x in cached_price.split(",") if x.strip()]
    except ValueError:
        fail(
            "--sweep-points and --cached-price take comma-separated numbers, e.g. 0,0.5,0.9", code=2
        )
    if (
        not hits
        or any(not 0 <= h <= 1 for h in hits)
        or not ratios
        or any(not 0 <= r <= 1 for r in ratios)
    ):
        fail("--sweep-points and --cached-price must be numbers in [0, 1]", code=2)
    out = []
    with _progress(quiet) as prog:
        for p in plans:
            task = prog.add_task(f"{p.name} hit-rate sweep", total=len(hits)) if prog else None
            rows = hit_rate_sweep(
                p,
                base,
                hits,
                ratios,
                seed,
                sim_kwargs,
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
    if plot is not None:
        from pddflow.sim.plots import bathtub

        plot.mkdir(parents=True, exist_ok=True)
        for g in out:
            path = bathtub(g["points"], g["graph"], plot / ("bathtub_" + g["graph"] + ".png"))
            print(f"wrote {path}", file=sys.stderr)
    if as_json:
        print(json.dumps({"sweep": "hit-rate", "graphs": out}, indent=2, default=_json_default))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    for g in out:
        keys = sorted({k for r in g["points"] for k in r if k.startswith("usd_per_gpu_hour@")})
        t = Table(
            title=f"{g['graph']}: benefit per GPU-hour against hit rate ({g['gpus']} GPUs, "
            f"${g['cost_per_hour']}/h, load: {g['load']})"
        )
        for col in [
            "target hit",
            "workload hit",
            "served hit",
            "offered rps",
            "TTFT P99 s",
            "SLA %",
            "goodput rps",
            *[f"$/GPU-h @{float(k.split('@')[1]):.0%}" for k in keys],
        ]:
            t.add_column(col, justify="right")
        for r in g["points"]:
            s = r["summary"]
            t.add_row(
                f"{r['target_hit']:.2f}",
                f"{r['workload_hit']:.3f}",
                f"{r['served_hit'] or 0:.3f}",
                f"{r['offered_rps']:.2f}",
                f"{s['ttft_s']['p99']:.2f}",
                f"{100 * s['sla_attainment']:.1f}",
                f"{s['slo_goodput_rps']:.2f}",
                *[f"{r[k]:.2f}" for k in keys],
            )
        con.print(t)


_RATIO_KEYS = (
    ("ttft_s", "p50"),
    ("ttft_s", "p90"),
    ("ttft_s", "p99"),
    ("tpot_ms", "p50"),
    ("tpot_ms", "p99"),
    ("slo_goodput_rps", None),
    ("cost_per_hour", None),
    ("bcr", None),
    ("wan_bytes", None),
)


def _ratios(results: list[dict]) -> dict:
    base = results[0]
    out = {}
    for r in results[1:]:
        row = {}
        for k, sub in _RATIO_KEYS:
            a = base[k][sub] if sub else base[k]
            b = r[k][sub] if sub else r[k]
            row[f"{k}.{sub}" if sub else k] = round(b / a, 4) if a else None
        out[r["graph"]] = row
    return out


def _json_default(o):
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


def _print_table(results: list[dict], wl) -> None:
    from rich.console import Console

    from pddflow.commands.tables import metric_table, percentile_rows

    con = Console()
    t = metric_table(
        f"simulate: {wl.name}, {len(wl.requests)} requests",
        [r["graph"] for r in results],
        results,
        [
            ("GPUs / $ per hour", lambda r: f"{r['gpus']} / {r['cost_per_hour']:.1f}"),
            *percentile_rows("TTFT {q} (s)", "ttft_s", ".3f", upper=True),
            *percentile_rows("TPOT {q} (ms)", "tpot_ms", ".2f", upper=True),
            ("SLA attainment", lambda r: f"{100 * r['sla_attainment']:.1f}%"),
            ("SLA goodput (req/s)", lambda r: f"{r['slo_goodput_rps']:.3f}"),
            ("BCR (SLA req per $)", lambda r: f"{r['bcr']:.2f}"),
            (
                "WAN GB (full KV GB)",
                lambda r: f"{r['wan_bytes'] / 1e9:,.0f} ({r['wan_bytes_full_kv'] / 1e9:,.0f})",
            ),
            (
                "WAN transfer P99 (s)",
                lambda r: (
                    "-"
                    if math.isnan(r["wan_transfer_s"]["p99"])
                    else f"{r['wan_transfer_s']['p99']:.2f}"
                ),
            ),
            ("relay token share", lambda r: f"{100 * r['relay_token_share']:.1f}%"),
            (
                "served hit (at transfer)",
                lambda r: (
                    "-"
                    if r["hit_rate"]["at_transfer_mean"] is None
                    else f"{r['hit_rate']['at_transfer_mean']:.3f}"
                ),
            ),
            ("variants", lambda r: ", ".join(f"{k} {v}" for k, v in r["variants"].items())),
            ("handoffs", lambda r: ", ".join(f"{k} {v}" for k, v in r["handoffs"].items()) or "-"),
            ("singular", lambda r: str(r["singular"])),
            ("failed", lambda r: str(r["failed"])),
            ("wall (s)", lambda r: f"{r['wall_s']:.2f}"),
        ],
    )
    con.print(t)
    if len(results) > 1:
        base = results[0]
        for r in results[1:]:
            con.print(
                f"{r['graph']} vs {base['graph']}: TTFT P99 x{r['ttft_s']['p99'] / base['ttft_s']['p99']:.2f}, "
                f"P90 x{r['ttft_s']['p90'] / base['ttft_s']['p90']:.2f}, BCR x{r['bcr'] / base['bcr']:.2f}"
                if base["ttft_s"]["p99"] and base["bcr"]
                else f"{r['graph']}: see table"
            )


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    app.command("simulate")(simulate)
