"""The hit-rate sweep: revenue of SLA-compliant requests per GPU-hour and per dollar of cost (GPUs
and any host-memory KV tier) from cold to fully cached; a graph with a tier buys its size at each
hit rate (docs/simulator.md, The bathtub)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from pddflow.graph.plan import Plan
from pddflow.sim.agentic import AgenticConfig, generate
from pddflow.sim.host_tier import ladder, tiered, with_host_gib
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


def _levels(plan: Plan) -> list[dict[str, float]]:
    """The host-tier sizes the sweep tries at every hit rate: one level per rung of the ladder,
    every tiered operator on the same rung ([{}]: no tier to size)."""
    ops = tiered(plan)
    if not ops:
        return [{}]
    rungs = {n: ladder(plan.operators[n].host_cache.max_gib) for n in ops}
    return [{n: rungs[n][i] for n in ops} for i in range(len(rungs[ops[0]]))]


def _point(
    plan: Plan, sim: Simulation, offered: float, cached_ratios, gib: dict[str, float]
) -> dict:
    """One simulated point: hits, load and revenue per GPU-hour and per dollar of cost."""
    wl = sim.workload
    flights = sim.flights
    row = {
        "workload_hit": wl.meta.get("hit_rate_unbounded"),
        "offered_rps": round(offered, 3),
        # the prefill instances' realised prefix hit: what the revenue prices as cached
        "prefill_hit": round(
            sum(
                min(r.prefill.hit_tokens, r.req.prompt_tokens) / r.req.prompt_tokens
                for r in flights
            )
            / max(len(flights), 1),
            4,
        ),
        "cost_per_hour": round(plan.cost_per_hour(), 4),
    }
    if gib:
        row["host_gib"] = dict(gib)
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
        row[f"usd_per_usd@{ratio:g}"] = m["revenue"]["usd_per_cost_usd"]
    return row


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
    """One row per hit rate, each at its SLA capacity (`load="capacity"`) or at `base.rps`.

    With a host tier (`host_cache.max_gib` > 0) every hit rate is simulated at each rung of the
    tier's ladder (0 and doublings up to max_gib), all listed under `tiers`; the row is the rung
    with the most revenue per dollar (GPU + tier cost) at the first cached price, and
    `host_gib@R` / `usd_per_usd@R` give each price's own best rung."""
    levels = _levels(plan)
    rows = []
    for i, h in enumerate(hits):
        cfg = replace(
            base, hit_rate=h, system_prompt_tokens=base.system_prompt_tokens if h >= 0.3 else 0
        )
        trials = []
        for gib in levels:
            p = with_host_gib(plan, gib) if gib else plan
            if load == "capacity":
                offered, sim, _ = sla_capacity(p, cfg, seed, sim_kwargs)
            else:
                offered = cfg.rps
                sim, _ = _trial(p, cfg, seed, sim_kwargs)
            trials.append(_point(p, sim, offered, cached_ratios, gib))
        first = f"usd_per_usd@{cached_ratios[0]:g}"
        row = {"target_hit": h, **max(trials, key=lambda t: t[first])}
        if len(trials) > 1:
            for ratio in cached_ratios:
                key = f"usd_per_usd@{ratio:g}"
                best = max(trials, key=lambda t: t[key])
                row[key] = best[key]
                row[f"usd_per_gpu_hour@{ratio:g}"] = best[f"usd_per_gpu_hour@{ratio:g}"]
                row[f"host_gib@{ratio:g}"] = best["host_gib"]
            row["tiers"] = trials
        rows.append(row)
        if progress:
            progress(i + 1, len(hits))
    return rows
