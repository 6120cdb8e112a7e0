"""`pddflow deploy`: run a graph for real."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import typer

from pddflow.commands.common import GRAPH_HELP, fail, load_or_exit, resolve_or_exit
from pddflow.commands.deploy_flags import (
    api_servers_option,
    check_engine_profile,
    cpu_pinning_option,
    engine_option,
    profile_option,
    stream_interval_option,
)
from pddflow.commands.progress import console, progress_bar
from pddflow.core.device import LOCAL_KV_CACHE_MIB
from pddflow.data import MOONCAKE_TRACE
from pddflow.runtime.deploy.modeled import DEFAULT_KV_SCALE


def deploy(
    graph: Path = typer.Argument(..., help=GRAPH_HELP, show_default=False),
    host: str = typer.Option("127.0.0.1", help="address the HTTP API listens on"),
    port: int = typer.Option(8000, min=0, max=65535, help="port of the HTTP API"),
    backend: str | None = typer.Option(
        None,
        help="where instances run: local (every instance a process here) or ray (actors on "
        "the Ray cluster at --address, placed by cluster resources; docs/deploy-ray.md); "
        "default: the graph's deploy.backend, else local",
        show_default=False,
    ),
    address: str | None = typer.Option(
        None,
        help="ray backend: the Ray cluster's address (default: the graph's deploy.address, "
        "RAY_ADDRESS, else 'auto')",
        show_default=False,
    ),
    kv_cache_mb: int = typer.Option(
        LOCAL_KV_CACHE_MIB, min=1, help="KV cache per worker, MiB (local profile)"
    ),
    startup_timeout: float = typer.Option(
        180.0, min=1.0, help="seconds to wait for every worker to be ready"
    ),
    leg_timeout: float = typer.Option(
        60.0, min=0.1, help="default deadline of one request's leg on a worker, s"
    ),
    seed: int = typer.Option(0, help="seed of the WAN emulation (jitter) so runs repeat"),
    wan_gbps: float | None = typer.Option(
        None,
        min=1e-6,
        help="emulate every link at this bandwidth instead "
        "of the graph's (a slower WAN on one machine)",
    ),
    run_dir: str | None = typer.Option(
        None,
        help="keep worker logs here (default: a private temp dir, removed on exit); the wiring "
        "file, which holds the deployment's token, is removed from it on exit",
    ),
    drain_timeout: float = typer.Option(
        30.0,
        min=0.0,
        help="on Ctrl-C or SIGTERM, new requests get 503 and running ones have this many "
        "seconds to finish before they are aborted; a second Ctrl-C stops at once",
    ),
    api_key: str | None = typer.Option(
        None,
        envvar="PDDFLOW_API_KEY",
        help="require 'Authorization: Bearer KEY' on /v1/* (default: open); /health and "
        "/metrics stay open",
        show_default=False,
    ),
    admin_key: str | None = typer.Option(
        None,
        envvar="PDDFLOW_ADMIN_KEY",
        help="enable the admin endpoints (/admin/links/NAME/cut, .../degrade, .../restore), "
        "guarded by this Bearer key; "
        "without it they do not exist (404)",
        show_default=False,
    ),
    log_level: str = typer.Option("warning", help="uvicorn and runtime log level"),
    model: str | None = typer.Option(
        None,
        "--model",
        help="serve this model instead of the graph's model.weights: a local Hugging Face "
        "checkpoint directory or a Hub id (owner/name, fetched into the Hub cache unless cached; "
        "HF_HUB_OFFLINE=1 uses the cache only) or builtin:<name>",
    ),
    chat_template: Path | None = typer.Option(
        None,
        "--chat-template",
        help="jinja chat template for /v1/chat/completions, instead of the checkpoint's own",
    ),
    planner: bool | None = typer.Option(
        None,
        "--planner/--no-planner",
        help="pools follow the load: every autoscale.interval_s the planner sizes each pool "
        "within 1..local.max_replicas from what it measures (docs/runtime.md, The planner); "
        "default: the graph's autoscale.enabled",
        show_default=False,
    ),
    cpu_pinning: str = cpu_pinning_option(),
    engine: str = engine_option(),
    profile: str = profile_option(),
    kv_scale: float = typer.Option(
        DEFAULT_KV_SCALE,
        min=1e-6,
        max=1.0,
        help="modeled engine: KV payloads at this fraction of the arch's true bytes, and every "
        "emulated link at this fraction of its bandwidth, so transfers take their true time",
    ),
    time_scale: float = typer.Option(
        1.0,
        min=1e-3,
        help="modeled engine: every step lasts this many times its modeled time (slow a fleet "
        "down uniformly when this machine cannot keep up)",
    ),
    stream_interval: int = stream_interval_option(),
    api_servers: int = api_servers_option(),
) -> None:
    """Deploy GRAPH with its `local` profile: every operator instance as its own process, the
    clusters emulated on this machine and the WAN shaped by the graph's link model; serve the
    OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models), /health and
    /metrics until Ctrl-C or SIGTERM; then drain (--drain-timeout) and stop every worker."""
    from pddflow.runtime.deploy.deployment import (
        DeployError,
        Deployment,
        DeployOptions,
        OptionError,
    )

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options = DeployOptions(
        host=host,
        port=port,
        backend=backend,
        address=address,
        kv_cache_mb=kv_cache_mb,
        startup_timeout_s=startup_timeout,
        leg_timeout_s=leg_timeout,
        seed=seed,
        wan_gbps=wan_gbps,
        run_dir=run_dir,
        drain_timeout_s=drain_timeout,
        api_key=api_key,
        admin_key=admin_key,
        log_level=log_level,
        model=model,
        chat_template=chat_template,
        cpu_pinning=cpu_pinning,
        planner=planner,
        engine=engine,
        kv_scale=kv_scale,
        time_scale=time_scale,
        profile=profile,
        stream_interval=stream_interval,
        api_servers=api_servers,
    )
    try:
        d = Deployment(load_or_exit(graph), options)
    except DeployError as exc:
        fail(str(exc), code=2 if isinstance(exc, OptionError) else 1)
    _run(d, bool(api_key), bool(admin_key))


def _run(d, api_key: bool, admin_key: bool) -> None:
    """Start `d` with a progress bar, say where it serves, serve until interrupted, stop."""
    from pddflow.runtime.deploy.deployment import DeployError, OptionError

    err = console(stderr=True)  # a log line is not wrapped at 80 columns when piped
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM during startup cleans up like Ctrl-C
    try:
        d.listen()
        n = len(d.plan.instances)
        with progress_bar(err) as bar:
            task = bar.add_task(f"starting {n} workers of {d.plan.name}")
            d.start(lambda msg, ready, n: bar.update(task, description=f"{msg}: {ready}/{n} ready"))
        names = ", ".join(i.id for i in d.plan.instances)
        err.print(
            f"[green]{d.plan.name}[/green]: {n} workers ready ({names}); serving {d.url} "
            f"(model {d.frontend.model_id!r}); logs in {d.run_dir}"
        )
        err.print(d.placement())
        err.print(
            f"/v1: {'API key required' if api_key else 'open (no --api-key)'}; /admin: "
            f"{'admin key required' if admin_key else 'off (no --admin-key)'}"
        )
        sys.stderr.flush()
        d.serve(err.print)
        err.print("stopping workers")
    except OptionError as exc:
        fail(str(exc), code=2)
    except DeployError as exc:
        fail(f"deployment failed: {exc}")
    except KeyboardInterrupt:
        err.print("interrupted; stopping workers")
    finally:
        d.stop()


def bench_serve(
    graphs: list[Path] | None = typer.Argument(
        None,
        help="graphs to compare, the first is the baseline "
        "(files or shipped graphs' names; default: cross_dc_pd pdd)",
    ),
    trace: Path = typer.Option(
        MOONCAKE_TRACE,
        help="Mooncake-format trace the sessions are derived from (default: the Mooncake "
        "conversation trace shipped in pddflow/data/)",
        show_default=False,
    ),
    sessions: int = typer.Option(12, min=1, help="concurrent multi-turn sessions"),
    turns: int = typer.Option(
        4, min=1, help="turns per session (each extends the previous context)"
    ),
    scale: float = typer.Option(1 / 32, min=1e-4, help="built-in model tokens per trace token"),
    rps: float = typer.Option(2.0, min=0.01, help="session starts per second"),
    max_output: int = typer.Option(
        128, min=1, help="cap on one turn's output tokens (trace lengths are scaled)"
    ),
    think: float = typer.Option(
        1.0, min=0.0, help="seconds between a turn's answer and the next turn (tool calls)"
    ),
    wan_gbps: float | None = typer.Option(
        None,
        min=1e-6,
        help="the emulated WAN's bandwidth for every graph (default: 0.1 Gbps with the real "
        "engine, where a cold 1,000-token prompt's KV takes about 2.6 s; the graphs' links "
        "with the modeled one)",
        show_default=False,
    ),
    wan_degrade: str | None = typer.Option(
        None,
        "--wan-degrade",
        metavar="AT_S:GBPS[:JITTER_P99_MS]",
        help="AT_S seconds into each graph's run, slow its emulated WAN to GBPS (and the jitter "
        "to that P99, its shape as declared) through the admin endpoint",
        show_default=False,
    ),
    timeout: float = typer.Option(120.0, min=1.0, help="deadline of one request, s"),
    seed: int = typer.Option(0, help="workload seed"),
    cpu_pinning: str = cpu_pinning_option(passed=True),
    backend: str = typer.Option(
        "local",
        help="passed to every `pddflow deploy`: local, or ray (every graph deployed on the Ray "
        "cluster at --address; docs/deploy-ray.md)",
    ),
    address: str | None = typer.Option(
        None, help="with --backend ray: the Ray cluster's address", show_default=False
    ),
    engine: str = engine_option(passed=True),
    profile: str = profile_option(passed=True),
    stream_interval: int = stream_interval_option(passed=True),
    api_servers: int = api_servers_option(passed=True),
    per_request: bool = typer.Option(
        False,
        "--per-request",
        help="with --json: every request's session, turn, "
        "start, TTFT and server-side timeline (KV sent/landed, first token)",
    ),
    exact: bool = typer.Option(
        False,
        "--exact",
        help="also run the workload on the colocated engine (greedy, before the graphs) and "
        "count the served answers that differ from it (tokens_exact in --json)",
    ),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Serve one multi-turn agentic workload (derived from a trace) on each graph in turn, under the
    same emulated WAN, and compare TTFT, TPOT, SLA goodput, WAN bytes, the decode-side prefix hit
    rate and relay token share."""
    import json as _json

    from rich.console import Console

    from pddflow.bench.serve_run import ServeError, ServeOptions, serve_graphs
    from pddflow.bench.wan_degrade import WanDegrade

    check_engine_profile(engine, profile)
    try:
        degrade = WanDegrade.parse(wan_degrade) if wan_degrade is not None else None
    except ValueError as exc:
        fail(str(exc), code=2)
    opts = ServeOptions(
        trace=trace,
        sessions=sessions,
        turns=turns,
        scale=scale,
        rps=rps,
        max_output=max_output,
        think_s=think,
        wan_gbps=0.1 if wan_gbps is None and engine == "real" else wan_gbps,
        degrade=degrade,
        timeout_s=timeout,
        seed=seed,
        cpu_pinning=cpu_pinning,
        backend=backend,
        address=address,
        engine=engine,
        profile=profile,
        stream_interval=stream_interval,
        api_servers=api_servers,
        per_request=per_request,
        exact=exact,
    )
    graphs = [resolve_or_exit(g) for g in graphs or [Path("cross_dc_pd"), Path("pdd")]]
    plans = [load_or_exit(g) for g in graphs]
    err = Console(stderr=True)
    # SIGTERM stops the deployment under test as Ctrl-C does (it would outlive this process)
    signal.signal(signal.SIGTERM, _interrupt)
    with progress_bar(err, counted=True) as bar:

        def track(name: str, total: int):
            task = bar.add_task(f"serving {name}", total=total)
            return lambda: bar.advance(task)

        try:
            out = serve_graphs(graphs, plans, opts, track, err.print)
        except ServeError as exc:
            fail(str(exc))
    if as_json:
        print(_json.dumps(out, indent=2))
        return
    _print_serve(out)


def _print_serve(out: dict) -> None:
    from pddflow.bench.wan_degrade import WanDegrade
    from pddflow.commands.tables import metric_table, percentile_rows

    con = console()
    wl = out["workload"]
    degrade = wl.get("wan_degrade")
    wan = f"{wl['wan_gbps']:g} Gbps" if wl["wan_gbps"] else "as declared"
    title = f"bench serve: {wl['requests']} requests, WAN {wan}"
    if degrade is not None:
        title += f" -> {WanDegrade(**degrade).describe()}"
    t = metric_table(
        title,
        [Path(r["graph"]).stem for r in out["graphs"]],
        out["graphs"],
        [
            *percentile_rows("TTFT {q} (s)", "ttft_s", ".3f"),
            *percentile_rows("TPOT {q} (ms)", "tpot_ms", ".1f"),
            ("SLA goodput (req/s)", lambda r: f"{r['slo_goodput_rps']:.3f}"),
            (
                "WAN MB (share of full KV)",
                lambda r: f"{r['wan_bytes'] / 1e6:.1f} ({r['wan_share_of_full_kv'] or 0:.0%})",
            ),
            ("prefix hit rate", lambda r: f"{r['prefix_hit_rate'] or 0:.1%}"),
            ("relay token share", lambda r: f"{r['relay_token_share']:.1%}"),
            *(
                [("answers not exact", lambda r: str(r["tokens_exact"]["mismatched"]))]
                if "tokens_exact" in out["graphs"][0]
                else []
            ),
            *(_degrade_rows() if degrade is not None else []),
            ("errors", lambda r: str(r["errors"])),
        ],
    )
    con.print(t)
    for g, rt in out["ratios_vs_first"].items():
        con.print(
            f"{Path(g).stem} / {Path(out['graphs'][0]['graph']).stem}: "
            + ", ".join(f"{k} x{v}" for k, v in rt.items() if v is not None)
        )


def _degrade_rows() -> list:
    """TTFT of the requests sent after the degrade, and the variants of those finished after."""

    def ttft_after(r: dict, q: str) -> str:
        d = r["wan_degrade"]
        got = (d.get("ttft_after_s") or {}).get(q)
        return "not applied" if d.get("applied_at_s") is None else f"{got:.3f}" if got else "-"

    def variants(r: dict) -> str:
        mix = r["wan_degrade"].get("variants_after") or {}
        return ", ".join(f"{v} {n}" for v, n in mix.items()) or "-"

    return [
        ("after degrade: TTFT P50 (s)", lambda r: ttft_after(r, "p50")),
        ("after degrade: TTFT P99 (s)", lambda r: ttft_after(r, "p99")),
        ("finished after degrade: variants", variants),
    ]


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    app.command("deploy")(deploy)
    bench_app.command("serve")(bench_serve)
