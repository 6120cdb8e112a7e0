"""What `pddflow plan` reports: the placement rows, the JSON document and the printed tables
(placement, cache tiers, what deploy runs, channels, the load split, each link, the verdict)."""

from __future__ import annotations

from typing import Any

from pddflow.commands.progress import console
from pddflow.graph.feasibility import Feasibility, LinkReport
from pddflow.graph.plan import Plan
from pddflow.runtime.transports import planned_transports


def placement(p: Plan) -> list[dict]:
    """One row per operator: where it runs, its KV budget and its cost (cache tiers' fields only
    with a tier declared, so graphs without one print what they always did)."""
    return [
        {
            "operator": op.name,
            "op": op.op_type,
            "cluster": op.cluster,
            "device": op.device,
            "replicas": op.replicas,
            "devices_per_replica": op.devices_per_replica,
            "kv_budget_gib": round(op.kv_budget_bytes / 2**30, 2),
            "kv_tokens": int(op.kv_budget_bytes // p.model.arch.kv_bytes_per_token),
            "usd_per_hour": round(
                op.replicas * op.usd_per_replica_hour(p.device_classes[op.device]), 2
            ),
            **_tier_fields("host_cache", op.host_cache, op.replicas),
            **_tier_fields("disk_cache", op.disk_cache, op.replicas),
        }
        for op in p.operators.values()
    ]


def _tier_fields(key: str, tier: Any, replicas: int) -> dict:
    """A cache tier's fields of a placement row (`host_cache_gib`, ...); none without the tier."""
    if tier is None:
        return {}
    out = {f"{key}_gib": tier.gib}
    if hasattr(tier, "max_gib"):
        out[f"{key}_max_gib"] = tier.max_gib
    out[f"{key}_gbytes_per_s"] = tier.gbytes_per_s
    out[f"{key}_usd_per_hour"] = round(replicas * tier.usd_per_replica_hour, 2)
    return out


def deployed_layout(p: Plan) -> list[dict]:
    """What `pddflow deploy` starts of each operator: instances and rank processes each."""
    local = p.scaled_to_local()
    return [
        {"operator": op.name, "instances": op.replicas, "ranks_per_instance": op.ranks}
        for op in local.operators.values()
    ]


def plan_json(graph: str, p: Plan, report: Feasibility) -> dict:
    links = [
        {
            "name": link.name,
            "required_gbps": link.required_gbps,
            "required_gbps_without_drc": link.required_gbps_without_drc,
            "available_gbps": link.available_gbps,
            "utilization": link.utilization,
            "transfer_p50_s": link.transfer_p50_s,
            "transfer_p99_s": link.transfer_p99_s,
            "classes": [vars(c) for c in link.classes],
            "channels": link.channels,
            "stream_gbps": link.stream_gbps,
            "streams": link.streams,
            "flow_cap_gbps": link.flow_cap_gbps,
        }
        for link in report.links
    ]
    return {
        "graph": graph,
        "load": vars(report.load),
        "placement": placement(p),
        "links": links,
        "cost_per_hour": round(p.cost_per_hour(), 2),
        "pools": [{"pool": q.pool, "share": q.share, "why": q.why} for q in report.pools],
        "transports": planned_transports(p),
        "deployed": deployed_layout(p),
        "feasible": report.feasible,
        "problems": report.problems,
        "notes": report.notes,
    }


def print_plan(p: Plan, report: Feasibility) -> None:
    rows = placement(p)
    _print_placement(p, rows)
    _print_tiers(rows)
    con = console()
    con.print(f"total hardware cost: ${p.cost_per_hour():.2f}/hour")
    for name, op in p.operators.items():
        if op.choices:
            other = ", ".join(f"{c.devices_per_replica} x {c.device}" for c in op.choices)
            con.print(f"{name}: `pddflow size` may also give each replica {other}")
    _print_deployed(p)
    _print_load(p, report)
    for link in report.links:
        _print_link(link)
    verdict = "[green]FEASIBLE[/green]" if report.feasible else "[red]NOT FEASIBLE[/red]"
    con.print(f"\nverdict: {verdict}")
    for prob in report.problems:
        con.print(f"  [red]problem[/red]: {prob}", markup=True)
    for note in report.notes:
        con.print(f"  note: {note}")


def _table(title: str, columns: tuple[str, ...], right: Any) -> Any:
    """A rich table with `columns`, right-aligned where `right(column)` says."""
    from rich.table import Table

    t = Table(title=title)
    for col in columns:
        t.add_column(col, justify="right" if right(col) else "left")
    return t


def _print_placement(p: Plan, rows: list[dict]) -> None:
    arch = p.model.arch
    t = _table(
        f"placement: {p.name} (model {arch.name}, "
        f"{arch.kv_bytes_per_token / 1024:.0f} KiB KV/token)",
        ("operator", "op", "cluster", "device", "replicas", "dev/replica", "KV GiB/replica")
        + ("KV tokens/replica", "$/hour"),
        lambda col: col[0].isupper() or "/" in col or col == "replicas",
    )
    for r in rows:
        t.add_row(
            r["operator"],
            r["op"],
            r["cluster"],
            r["device"],
            str(r["replicas"]),
            str(r["devices_per_replica"]),
            f"{r['kv_budget_gib']:.1f}",
            f"{r['kv_tokens']:,}",
            f"{r['usd_per_hour']:.2f}",
        )
    console().print(t)


# placement-row prefix, title, (column, field, format) of each cache tier's table
TIER_TABLES = (
    (
        "host_cache",
        "host-memory KV tiers (under the operator's cache)",
        (
            ("GiB/replica", "gib", "g"),
            ("max GiB", "max_gib", "g"),
            ("GB/s to HBM", "gbytes_per_s", "g"),
            ("$/hour", "usd_per_hour", ".2f"),
        ),
    ),
    (
        "disk_cache",
        "disk KV tiers (under the operator's cache, written through)",
        (
            ("GiB/replica", "gib", "g"),
            ("GB/s to HBM", "gbytes_per_s", "g"),
            ("$/hour", "usd_per_hour", ".2f"),
        ),
    ),
)


def _print_tiers(rows: list[dict]) -> None:
    for key, title, columns in TIER_TABLES:
        tiered = [r for r in rows if f"{key}_gib" in r]
        if not tiered:
            continue
        heads = tuple(head for head, _, _ in columns)
        t = _table(title, ("operator", *heads), lambda col: col != "operator")
        for r in tiered:
            t.add_row(r["operator"], *(format(r[f"{key}_{f}"], spec) for _, f, spec in columns))
        console().print(t)


def _print_deployed(p: Plan) -> None:
    con = console()
    dt = _table(
        "what `pddflow deploy` runs (the local profile)",
        ("operator", "instances", "ranks (tensor parallel) each", "processes"),
        lambda col: col != "operator",
    )
    for row in deployed_layout(p):
        n, ranks = row["instances"], row["ranks_per_instance"]
        dt.add_row(row["operator"], str(n), str(ranks), str(n * ranks))
    con.print(dt)
    tt = _table(
        "channels: how `pddflow deploy` carries each edge",
        ("channel", "kind", "--backend local", "--backend ray"),
        lambda col: False,
    )
    for row in planned_transports(p):
        tt.add_row(row["channel"], row["kind"], row["local"], row["ray"])
    con.print(tt)


def _print_load(p: Plan, report: Feasibility) -> None:
    ld = report.load
    console().print(
        f"\nload: {ld.rps:g} req/s, {ld.prompt_tokens:,} prompt tokens, "
        f"{ld.output_tokens:,} output tokens, {ld.hit_rate:.0%} average prefix hit"
    )
    st = _table(
        "load split between decode pools",
        ("pool", "cluster", "share of requests", "from"),
        lambda col: col.startswith("share"),
    )
    for pool in report.pools:
        st.add_row(pool.pool, p.operators[pool.pool].cluster, f"{pool.share:.1%}", pool.why)
    console().print(st)


def _print_link(link: LinkReport) -> None:
    con = console()
    lt = _table(
        f"link {link.name}: {link.available_gbps:g} Gbps, {link.utilization:.0%} used",
        ("request class", "hit", "KV to send", "transfer P50", "transfer P99"),
        lambda col: True,
    )
    for c in link.classes:
        lt.add_row(
            c.name,
            f"{c.hit_rate:.0%}",
            f"{c.kv_bytes / 1e9:.2f} GB",
            f"{c.transfer_p50_s:.2f} s",
            f"{c.transfer_p99_s:.2f} s",
        )
    con.print(lt)
    con.print(
        f"  bandwidth needed: {link.required_gbps:.1f} Gbps with the decode-side radix "
        f"cache, {link.required_gbps_without_drc:.1f} Gbps without "
        f"(link gives {link.available_gbps:g})"
    )
    con.print(
        "  per transfer: "
        + (
            f"{link.streams} stream(s) x {link.stream_gbps:g} Gbps = at most "
            f"{link.flow_cap_gbps:g} Gbps (stream_gbps: declared, or tcp_window_mib / rtt_ms)"
            if link.flow_cap_gbps > 0
            else "no per-stream cap (rtt 0 or stream_gbps 0): the link's share"
        )
    )
