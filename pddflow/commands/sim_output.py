"""How `pddflow simulate` prints its results: the comparison table, the sweep's table and plots,
ratios against the first graph."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from pddflow.commands.progress import console


def print_sweep(out: list[dict], as_json: bool, plot: Path | None) -> None:
    if plot is not None:
        from pddflow.sim.plots import bathtub

        plot.mkdir(parents=True, exist_ok=True)
        for g in out:
            path = bathtub(g["points"], g["graph"], plot / ("bathtub_" + g["graph"] + ".png"))
            print(f"wrote {path}", file=sys.stderr)
    if as_json:
        print(json.dumps({"sweep": "hit-rate", "graphs": out}, indent=2, default=json_default))
        return
    from rich.table import Table

    con = console()
    for g in out:
        keys = sorted({k for r in g["points"] for k in r if k.startswith("usd_per_gpu_hour@")})
        ratios_ = [k.split("@")[1] for k in keys]
        tier = any("tiers" in r for r in g["points"])
        t = Table(
            title=f"{g['graph']}: benefit per GPU-hour and per $ against hit rate ({g['gpus']} "
            f"GPUs, ${g['cost_per_hour']}/h without a host tier, load: {g['load']})"
        )
        for col in [
            "target hit",
            "workload hit",
            "prefill hit",
            "served hit",
            "offered rps",
            "TTFT P99 s",
            "SLA %",
            "goodput rps",
            *[f"$/GPU-h @{float(x):.0%}" for x in ratios_],
            *[f"$ per $ @{float(x):.0%}" for x in ratios_],
            *([f"host GiB @{float(x):.0%}" for x in ratios_] if tier else []),
        ]:
            t.add_column(col, justify="right")
        for r in g["points"]:
            s = r["summary"]
            t.add_row(
                f"{r['target_hit']:.2f}",
                f"{r['workload_hit']:.3f}",
                f"{r.get('prefill_hit', 0):.3f}",
                f"{r['served_hit'] or 0:.3f}",
                f"{r['offered_rps']:.2f}",
                f"{s['ttft_s']['p99']:.2f}",
                f"{100 * s['sla_attainment']:.1f}",
                f"{s['slo_goodput_rps']:.2f}",
                *[f"{r[f'usd_per_gpu_hour@{x}']:.2f}" for x in ratios_],
                *[f"{r[f'usd_per_usd@{x}']:.3f}" for x in ratios_],
                *(
                    [", ".join(f"{v:g}" for v in r[f"host_gib@{x}"].values()) for x in ratios_]
                    if tier
                    else []
                ),
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


def ratios(results: list[dict]) -> dict:
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


def json_default(o):
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


def print_results(results: list[dict], wl, as_json: bool) -> None:
    """One graph's result as JSON, several with their ratios against the first; else the table."""
    if not as_json:
        print_table(results, wl)
        return
    one = len(results) == 1
    out = results[0] if one else {"graphs": results, "ratios_vs_first": ratios(results)}
    print(json.dumps(out, indent=2, default=json_default))


def print_table(results: list[dict], wl) -> None:

    from pddflow.commands.tables import metric_table, percentile_rows

    con = console()
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
            (
                "pools: served (plan's rule)",
                lambda r: ", ".join(
                    f"{k} {p['share']:.0%} ({p['plan_share']:.0%})" for k, p in r["pools"].items()
                ),
            ),
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
                f"{r['graph']} vs {base['graph']}: "
                f"TTFT P99 x{r['ttft_s']['p99'] / base['ttft_s']['p99']:.2f}, "
                f"P90 x{r['ttft_s']['p90'] / base['ttft_s']['p90']:.2f}, "
                f"BCR x{r['bcr'] / base['bcr']:.2f}"
                if base["ttft_s"]["p99"] and base["bcr"]
                else f"{r['graph']}: see table"
            )
