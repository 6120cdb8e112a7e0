"""PNG plots (matplotlib, Agg backend): TTFT CDF per graph, per-variant timelines, the bathtub."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pddflow.sim.simulator import Simulation


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ttft_cdf(sims: list[Simulation], path: Path) -> Path:
    import numpy as np

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for sim in sims:
        v = np.sort([r.first_token_at - r.arrival for r in sim.flights if r.done and not r.failed])
        if len(v):
            ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=sim.plan.name)
    sla = sims[0].plan.scheduler.ttft_s if sims else None
    if sla:
        ax.axvline(sla, color="grey", linestyle=":", label=f"TTFT SLA {sla:g} s")
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("share of requests")
    ax.set_title(f"TTFT CDF: {sims[0].workload.name}" if sims else "TTFT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def variant_timeline(sim: Simulation, path: Path, bin_s: float | None = None) -> Path:
    import numpy as np

    plt = _plt()
    flights = [r for r in sim.flights if r.done and not r.failed]
    t_end = max((r.arrival for r in sim.flights), default=1.0)
    bin_s = bin_s or max(1.0, t_end / 60)
    edges = np.arange(0, t_end + bin_s, bin_s)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)

    def label(r) -> str:
        return r.decision.variant + (" (singular)" if r.decision.singular else "")

    for lab in sorted({label(r) for r in sim.flights}):
        ts = [r.arrival for r in sim.flights if label(r) == lab]
        h, _ = np.histogram(ts, edges)
        a1.plot(edges[:-1], h / bin_s, label=lab, drawstyle="steps-post")
        pts = [(r.arrival, r.first_token_at - r.arrival) for r in flights if label(r) == lab]
        if pts:
            x, y = zip(*pts)
            a2.scatter(x, y, s=3, alpha=0.5, label=lab)
    a1.set_ylabel("requests/s")
    a1.set_title(f"{sim.plan.name}: variants over time")
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3)
    a2.set_yscale("log")
    a2.set_ylabel("TTFT (s)")
    a2.set_xlabel("arrival time (s)")
    a2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def bathtub(rows: list[dict], graph: str, path: Path) -> Path:
    """Revenue per GPU-hour and per dollar of cost (GPUs + host tier) against the workload hit."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, prefix, ylabel in (
        (axes[0], "usd_per_gpu_hour@", "SLA revenue per GPU-hour (USD)"),
        (axes[1], "usd_per_usd@", "SLA revenue per USD of cost (GPUs + host tier)"),
    ):
        keys = sorted({k for r in rows for k in r if k.startswith(prefix)})
        for k in keys:
            pts = sorted((r["workload_hit"], r[k]) for r in rows)
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                label=f"cached tokens at {float(k.split('@')[1]):.0%} of uncached",
            )
        ax.set_xlabel("average prefix-cache hit rate (workload, unbounded cache)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{graph}: benefit against hit rate")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
