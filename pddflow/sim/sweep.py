"""The hit-rate sweep: revenue of SLA-compliant requests per GPU-hour from cold to fully cached."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from pddflow.graph.plan import Plan
from pddflow.sim.agentic import AgenticConfig, generate
from pddflow.sim.metrics import summarize
from pddflow.sim.simulator import Simulation

DEFAULT_HITS = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
DEFAULT_CACHED_RATIOS = (0.10, 0.25)
INPUT_USD_PER_MTOK = 1.0  # uncached prompt tokens
OUTPUT_USD_PER_MTOK = 4.0


def _trial(
    plan: Plan, cfg: AgenticConfig, seed: int, sim_kwargs: dict | None
) -> tuple[Simulation, dict]:
    sim = Simulation(plan, generate(cfg), seed=seed, **(sim_kwargs or {}))
    sim.run()
    return sim, summarize(sim)


def sla_capacity(
    plan: Plan,
    cfg: AgenticConfig,
    seed: int = 0,
    sim_kwargs: dict | None = None,
    attainment: float = 0.95,
    steps: int = 4,
) -> tuple[float, Simulation, dict]:
    """(offered rps, run, summary) at the highest rate where `attainment` of requests meet the SLA
    (closed-loop sessions: the served rate is measured)."""
    rps = cfg.rps
    sim, m = _trial(plan, replace(cfg, rps=rps), seed, sim_kwargs)
    ok = m["sla_attainment"] >= attainment
    good = (rps, sim, m) if ok else None
    lo, hi = (rps, None) if ok else (None, rps)
    for _ in range(8):
        if lo is not None and hi is not None:
            break
        rps = rps * 2 if ok else rps / 2
        sim, m = _trial(plan, replace(cfg, rps=rps), seed, sim_kwargs)
        ok = m["sla_attainment"] >= attainment
        if ok:
            lo, good = rps, (rps, sim, m)
        else:
            hi = rps
    if lo is None or hi is None:
        return good or (rps, sim, m)
    for _ in range(steps):
        mid = (lo * hi) ** 0.5
        sim, m = _trial(plan, replace(cfg, rps=mid), seed, sim_kwargs)
        if m["sla_attainment"] >= attainment:
            lo, good = mid, (mid, sim, m)
        else:
            hi = mid
    return good


def hit_rate_sweep(
    plan: Plan,
    base: AgenticConfig,
    hits=DEFAULT_HITS,
    cached_ratios=DEFAULT_CACHED_RATIOS,
    seed: int = 0,
    sim_kwargs: dict | None = None,
    progress: Callable[[int, int], None] | None = None,
    load: str = "capacity",
) -> list[dict]:
    """One row per hit rate, each at its SLA capacity (`load="capacity"`) or at `base.rps`."""
    rows = []
    for i, h in enumerate(hits):
        cfg = replace(
            base, hit_rate=h, system_prompt_tokens=base.system_prompt_tokens if h >= 0.3 else 0
        )
        if load == "capacity":
            offered, sim, _ = sla_capacity(plan, cfg, seed, sim_kwargs)
        else:
            offered = cfg.rps
            sim, _ = _trial(plan, cfg, seed, sim_kwargs)
        wl = sim.workload
        row = {
            "target_hit": h,
            "workload_hit": wl.meta.get("hit_rate_unbounded"),
            "offered_rps": round(offered, 3),
        }
        for ratio in cached_ratios:
            m = summarize(
                sim,
                {
                    "input_per_mtok": INPUT_USD_PER_MTOK,
                    "output_per_mtok": OUTPUT_USD_PER_MTOK,
                    "cached_ratio": ratio,
                },
            )
            row.setdefault("served_hit", m["hit_rate"]["at_transfer_mean"])
            row.setdefault(
                "summary",
                {
                    k: m[k]
                    for k in (
                        "ttft_s",
                        "tpot_ms",
                        "slo_goodput_rps",
                        "sla_attainment",
                        "bcr",
                        "relay_token_share",
                        "variants",
                        "wan_bytes",
                    )
                },
            )
            row[f"usd_per_gpu_hour@{ratio:g}"] = m["revenue"]["usd_per_gpu_hour"]
        rows.append(row)
        if progress:
            progress(i + 1, len(hits))
    return rows
