"""`pddflow bench elastic`'s run, for the command to call with its options as one typed object:
the load ramp's sessions, each mode's deployment served in turn (bench/elastic.py), every answer
checked against the colocated reference, and the report `--json` prints."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pddflow.bench.elastic import (
    elastic_graph,
    ramp_starts,
    reference_mismatches,
    run_mode,
    summarize,
)
from pddflow.data import MOONCAKE_TRACE
from pddflow.graph.plan import Plan


class ElasticError(RuntimeError):
    """The workload could not be built or a mode's deployment failed; the message says which."""


@dataclass(frozen=True, kw_only=True)
class ElasticOptions:
    modes: tuple[str, ...] = ("fixed_min", "fixed_max", "planner")  # bench/elastic.py MODES
    max_replicas: int | None = 3  # each pool's most; None: as the graph declares
    low_rps: float = 0.25  # session starts per second in the low phases
    peak_rps: float = 1.0
    phase_s: float = 60.0
    turns: int = 2
    scale: float = 1 / 32  # built-in model tokens per trace token
    max_output: int = 64
    think_s: float = 1.0
    interval_s: float = 2.0  # the planner's autoscale.interval_s
    scale_down_after_s: float = 20.0
    sla_ttft_s: float | None = None  # None: the graph's scheduler.sla
    sla_tpot_ms: float | None = None
    timeout_s: float = 120.0
    seed: int = 0
    cpu_pinning: str = "none"
    engine: str = "real"
    time_scale: float = 1.0  # modeled: steps, the SLA, starts and think time this much longer

    def deploy_args(self) -> tuple[str, ...]:
        args = ("--cpu-pinning", self.cpu_pinning, "--engine", self.engine)
        return args + (("--time-scale", str(self.time_scale)) if self.engine == "modeled" else ())


def run_elastic(
    path: Path,
    opts: ElasticOptions,
    plan: Plan,
    track: Callable[[str, int], Callable[[], None]],
    say: Callable[[str], None] = lambda _: None,
) -> dict:
    """Every mode of `opts` on graph `path` (`plan`: its local profile); `track(mode, requests)`
    gives each run's per-request tick."""
    from pddflow.bench.deploy_process import LaunchError
    from pddflow.core.serve_sessions import TraceError, build
    from pddflow.operators.hub import resolve_model
    from pddflow.runtime.frontend.model_info import model_info

    ts = opts.time_scale
    ttft_s = opts.sla_ttft_s or plan.scheduler.ttft_s
    tpot_ms = opts.sla_tpot_ms or plan.scheduler.tpot_ms
    # the deployment's SLA, as its time runs: what the planner holds and attainment counts
    sla_over = {"ttft_s": ttft_s * ts, "tpot_ms": tpot_ms * ts}
    starts = [t * ts for t in ramp_starts(opts.low_rps, opts.peak_rps, opts.phase_s)]
    try:
        weights = resolve_model(plan.model.weights)
        vocab = model_info(weights).vocab_size
        workload = build(
            MOONCAKE_TRACE,
            len(starts),
            opts.turns,
            opts.scale,
            min(vocab, 256),
            opts.seed,
            opts.max_output,
        )
    except (TraceError, OSError) as exc:
        raise ElasticError(str(exc)) from exc
    # devices an instance holds: a modeled one stands for a whole production replica
    ranks = {
        n: op.devices_per_replica if opts.engine == "modeled" else op.ranks
        for n, op in plan.operators.items()
    }
    autoscale = {
        "interval_s": opts.interval_s * ts,
        "scale_down_after_s": opts.scale_down_after_s * ts,
    }
    runs = []
    with tempfile.TemporaryDirectory(prefix="pddflow-elastic-graphs-") as gd:
        for mode in opts.modes:
            g = elastic_graph(path, mode, opts.max_replicas, autoscale, Path(gd), sla_over)
            tick = track(mode, workload.requests)
            try:
                runs.append(
                    run_mode(
                        mode,
                        g,
                        ranks,
                        workload,
                        starts,
                        opts.think_s * ts,
                        opts.timeout_s * ts,
                        tick,
                        opts.deploy_args(),
                    )  # fmt: skip
                )
            except LaunchError as exc:
                raise ElasticError(f"{path} ({mode}): {exc}") from exc
    say("checking every answer against the colocated engine's greedy tokens")
    wrong = reference_mismatches(str(weights), runs, engine=opts.engine)
    rows = [
        summarize(r, sla_over["ttft_s"], sla_over["tpot_ms"] / 1e3, wrong[r.mode]) for r in runs
    ]
    out = {
        "graph": str(path),
        "engine": opts.engine,
        "time_scale": ts,
        "workload": {
            "sessions": len(starts),
            "turns": opts.turns,
            "requests": workload.requests,
            "low_rps": opts.low_rps,
            "peak_rps": opts.peak_rps,
            "phase_s": opts.phase_s,
            "max_replicas": "declared" if opts.max_replicas is None else str(opts.max_replicas),
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
    return out
