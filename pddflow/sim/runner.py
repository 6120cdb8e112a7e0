"""Plans simulated as `pddflow simulate` reports them: calibrated, settled, replicated."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from pddflow.graph.plan import Plan
from pddflow.sim.calibration import Calibration, HostSpec, Measurements, calibrated_plan, settle
from pddflow.sim.engine import StepKind
from pddflow.sim.metrics import request_rows, summarize
from pddflow.sim.simulator import Simulation
from pddflow.sim.workload import Workload


@dataclass(frozen=True)
class RunOptions:
    seed: int = 0
    # other draws of the random parts; each TTFT/TPOT percentile is the median over them
    replications: int = 1
    stream_gbps: float | None = None  # every link's per-stream rate (None: as declared)
    strict_mirrors: bool = False
    embedded: bool = False
    wan_jitter_seed: int | None = None
    planner: bool = False  # pools follow the load (the graph's autoscale: section)


def with_wan_gbps(plan: Plan, gbps: float | None) -> Plan:
    """Every link of `plan` at `gbps` (as `pddflow deploy --wan-gbps`)."""
    if gbps is None:
        return plan
    return replace(plan, links={n: replace(link, gbps=gbps) for n, link in plan.links.items()})


def with_stream_gbps(plan: Plan, gbps: float | None) -> Plan:
    """Every link of `plan` with one stream sustaining `gbps` (0: no per-stream cap)."""
    if gbps is None:
        return plan
    return replace(
        plan, links={n: replace(link, stream_gbps=gbps) for n, link in plan.links.items()}
    )


def calibrated(
    plans: list[Plan], measured: Measurements, host: HostSpec | None, local: bool = True
) -> tuple[list[Plan], list[Calibration]]:
    cals = [measured.calibration(p.source, host) for p in plans]
    return [calibrated_plan(p, measured.engine, local=local) for p in plans], cals


def prepared(
    plans: list[Plan], measured: Measurements | None, local: bool, host: HostSpec | None
) -> tuple[list[Plan], list[Calibration]]:
    """The plans as simulated, with their calibrations: fit to `measured` (on the local profile
    unless `local` is False), else uncalibrated, scaled to the local profile when `local`."""
    if measured is not None:
        return calibrated(plans, measured, host, local)
    return [p.scaled_to_local() for p in plans] if local else plans, [
        Calibration(host=host) for _ in plans
    ]


def simulate_each(
    plans: list[Plan],
    cals: list[Calibration],
    workload: Workload,
    options: RunOptions,
    *,
    per_request: bool = False,
    measured: Measurements | None = None,
    track: Callable[[str, int], Callable[[int, int], None] | None] | None = None,
) -> tuple[list[dict], list[Simulation]]:
    """`simulate` of each plan on the same workload: the reports (with every request's row when
    `per_request`, the workload's name and numbers, and what `measured` fit) and the replays.
    `track(name, requests)` gives each plan's progress callback. A plan the simulator refuses is
    a ValueError naming its graph file."""
    results, sims = [], []
    for plan, cal in zip(plans, cals):
        tick = track(plan.name, len(workload.requests)) if track is not None else None
        try:
            result, sim = simulate(plan, workload, cal, options, progress=tick)
        except ValueError as exc:
            raise ValueError(f"{plan.source}: {exc}") from exc
        if per_request:
            result["per_request"] = request_rows(sim)
        result["workload"] = {
            "name": workload.name,
            **{k: v for k, v in workload.meta.items() if isinstance(v, (int, float, str))},
        }
        if measured is not None:
            result["calibration"] = measured.report(plan.source)
        results.append(result)
        sims.append(sim)
    return results, sims


def simulate(
    plan: Plan,
    workload: Workload,
    calibration: Calibration | None,
    options: RunOptions,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[dict, Simulation]:
    """The report (summary plus what the calibration settled) and the first replay."""

    def replay(cal: Calibration, seed: int = options.seed) -> Simulation:
        sim = Simulation(
            plan,
            workload,
            seed=seed,
            strict_mirrors=options.strict_mirrors,
            stream_gbps=options.stream_gbps,
            calibration=cal,
            embedded=options.embedded,
            wan_jitter_seed=options.wan_jitter_seed,
            planner=plan.autoscale if options.planner else None,
        )
        sim.run(progress=progress)
        return sim

    cal = calibration or Calibration()
    settled = settle(cal, replay)
    sim, final = settled.simulation, settled.calibration
    result = summarize(sim)
    if options.replications > 1:
        more = [replay(final, options.seed + r) for r in range(1, options.replications)]
        result = pool([result] + [summarize(s) for s in more])
    if final.host is not None and cal.prefill_wall_over_cpu:
        result["prefill_wall"] = _wall_report(
            sim, cal.prefill_wall_over_cpu, final.host.prefill_wall
        )
    if sim.host is not None:
        result["cpu_share"] = sim.host.to_dict()
    return result, sim


def _wall_report(sim: Simulation, measured: dict, factors: dict) -> dict:
    """Per prefill instance: its measured wall over CPU, the replay's wall over model time, and
    the factor settled for it."""
    out = {}
    for inst, ratio in sorted(measured.items()):
        eng = sim.engines.get(inst)
        simulated = eng.wall_over_model(StepKind.PREFILL) if eng is not None else None
        out[inst] = {
            "measured_wall_over_cpu": round(ratio, 4),
            "simulated_wall_over_model": None if simulated is None else round(simulated, 4),
            "factor": round(factors.get(inst, 1.0), 4),
        }
    return out


def pool(results: list[dict]) -> dict:
    """The first result, with each TTFT and TPOT percentile the median over the replications."""
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
