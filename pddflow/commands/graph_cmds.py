"""Graph commands: validate, schema, viz, plan. Instant: no torch, pyarrow or grpc."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from pddflow.commands.common import GRAPH_HELP, fail, load_or_exit, resolve_or_exit


def validate(
    graphs: list[Path] = typer.Argument(
        ..., help=f"{GRAPH_HELP}; several to check", show_default=False
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only problems"),
) -> None:
    """Check graph files: YAML, then the schema, then the semantics (ports, payload types, channel
    scopes, links, placement, memory, variants). Prints every problem as FILE:LINE:COL: message.
    Exit 0 when all are valid, 1 when any is not, 2 on a usage error."""
    from pddflow.graph import check_file

    bad = False
    for g in graphs:
        g = resolve_or_exit(g)
        if g.is_dir():
            fail(f"{g}: is a directory; pass graph files (e.g. {g}/*.yaml)", code=2)
        checked = check_file(str(g))
        for d in checked.diagnostics:
            print(d)
        if checked.ok:
            if not quiet:
                p = checked.plan
                print(
                    f"{g}: ok ({len(p.operators)} operators, {len(p.channels)} edges, "
                    f"{len(p.variants)} variants)"
                )
        else:
            bad = True
            print(f"{g}: {len(checked.errors)} error(s)", file=sys.stderr)
    raise typer.Exit(1 if bad else 0)


def schema(
    registries: bool = typer.Option(
        False,
        "--list",
        help="list operator types, channel kinds, policies and "
        "architecture presets instead of printing the JSON Schema",
    ),
) -> None:
    """Print the JSON Schema of the graph format (point your editor's YAML plugin at it)."""
    if registries:
        _print_registries()
        return
    from pddflow.graph.spec import json_schema

    print(json.dumps(json_schema(), indent=2))


def _print_registries() -> None:
    from pddflow.core.arch import ARCHS
    from pddflow.core.channel_kinds import CHANNEL_KINDS
    from pddflow.core.operator_types import OPERATOR_TYPES
    from pddflow.core.policies import POLICIES

    print("operator types:")
    for n in OPERATOR_TYPES:
        t = OPERATOR_TYPES.get(n)
        ins = ", ".join(f"{p}: {v}" for p, v in t.inputs.items())
        outs = ", ".join(f"{p}: {v}" for p, v in t.outputs.items())
        print(f"  {n:<13} in [{ins}] out [{outs}]  {t.help}")
        _print_params(t.params, 13)
    print("channel kinds:")
    for n in CHANNEL_KINDS:
        k = CHANNEL_KINDS.get(n)
        carries = ", ".join(sorted(map(str, k.carries)))
        print(f"  {n:<13} carries {carries}; scope {k.scope}  {k.help}")
        _print_params(k.params, 13)
    print("scheduler policies:")
    for n in POLICIES:
        pol = POLICIES.get(n)
        print(f"  {n:<20} {pol.help}")
        _print_params(pol.params, 20)
    print("model architecture presets:")
    for n in ARCHS:
        a = ARCHS.get(n)
        print(
            f"  {n:<16} {a.kv_bytes_per_token / 1024:.0f} KiB/token KV, "
            f"{a.weight_bytes / 1e9:.0f} GB weights  {a.help}"
        )


def _print_params(params: dict, width: int) -> None:
    for p, spec in params.items():
        kind = spec.type.__name__
        print(f"  {'':<{width}}   params.{p} ({kind}, default {spec.default!r}): {spec.help}")


def viz(
    graph: Path = typer.Argument(..., help=GRAPH_HELP, show_default=False),
    fmt: str = typer.Option(
        "ascii", "--format", "-f", help="ascii (terminal), dot, mermaid or svg (needs Graphviz)"
    ),
    variant: str | None = typer.Option(
        None, "--variant", "-v", help="highlight one pipeline variant"
    ),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="write here instead of standard output"
    ),
) -> None:
    """Draw a graph: clusters with their operators, edges labelled with channel kind and
    bandwidth."""
    from pddflow.core.registry import did_you_mean
    from pddflow.graph.render import FORMATS, RenderError, render

    if fmt not in FORMATS:
        fail(
            f"unknown format {fmt!r}{did_you_mean(fmt, FORMATS)}; formats: {', '.join(FORMATS)}",
            code=2,
        )
    plan = load_or_exit(graph)
    if variant is not None and variant not in plan.variants:
        fail(
            f"{graph} has no variant {variant!r}{did_you_mean(variant, plan.variants)}; variants: "
            f"{', '.join(plan.variants)}",
            code=2,
        )
    try:
        text = render(plan, fmt, variant)
    except RenderError as exc:
        fail(str(exc))
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        print(f"wrote {output}", file=sys.stderr)


def plan(
    graph: Path = typer.Argument(..., help=GRAPH_HELP, show_default=False),
    rps: float = typer.Option(
        5.0, "--rps", min=0.0, help="requests per second offered to the deployment"
    ),
    prompt_tokens: int = typer.Option(
        65536, "--prompt-tokens", min=1, help="prompt length in tokens"
    ),
    output_tokens: int = typer.Option(
        1024, "--output-tokens", min=1, help="output length in tokens"
    ),
    hit_rate: float = typer.Option(
        0.9,
        "--hit-rate",
        min=0.0,
        max=1.0,
        help="average prefix-cache hit rate (agentic traffic: about 0.9)",
    ),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
    check: bool = typer.Option(
        False, "--check", help="exit 1 when the verdict is NOT FEASIBLE (a gate for CI)"
    ),
) -> None:
    """Placement table and feasibility report: WAN bandwidth needed against each link (with and
    without a decode-side radix cache), KV transfer time P50/P99 per request class, and a
    verdict (exit 0; with --check, exit 1 on NOT FEASIBLE)."""
    from pddflow.graph.feasibility import Load, analyze
    from pddflow.runtime.transports import planned_transports

    p = load_or_exit(graph)
    report = analyze(p, Load(rps, prompt_tokens, output_tokens, hit_rate))
    placement = [
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
            # only with a tier declared, so graphs without one print what they always did
            **_tier_fields("host_cache", op.host_cache, op.replicas),
            **_tier_fields("disk_cache", op.disk_cache, op.replicas),
        }
        for op in p.operators.values()
    ]
    if as_json:
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
        print(
            json.dumps(
                {
                    "graph": str(graph),
                    "load": vars(report.load),
                    "placement": placement,
                    "links": links,
                    "cost_per_hour": round(p.cost_per_hour(), 2),
                    "pools": [
                        {"pool": q.pool, "share": q.share, "why": q.why} for q in report.pools
                    ],
                    "transports": planned_transports(p),
                    "deployed": deployed_layout(p),
                    "feasible": report.feasible,
                    "problems": report.problems,
                    "notes": report.notes,
                },
                indent=2,
            )
        )
    else:
        _print_plan(p, placement, report)
    raise typer.Exit(1 if check and not report.feasible else 0)


def _tier_fields(key: str, tier, replicas: int) -> dict:
    """A cache tier's fields of a placement row (`host_cache_gib`, ...); none without the tier."""
    if tier is None:
        return {}
    out = {f"{key}_gib": tier.gib}
    if hasattr(tier, "max_gib"):
        out[f"{key}_max_gib"] = tier.max_gib
    out[f"{key}_gbytes_per_s"] = tier.gbytes_per_s
    out[f"{key}_usd_per_hour"] = round(replicas * tier.usd_per_replica_hour, 2)
    return out


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


def _print_plan(p, placement, report) -> None:
    from rich.table import Table

    from pddflow.commands.progress import console

    con = console()
    arch = p.model.arch
    t = Table(
        title=f"placement: {p.name} (model {arch.name}, "
        f"{arch.kv_bytes_per_token / 1024:.0f} KiB KV/token)"
    )
    for col in (
        "operator",
        "op",
        "cluster",
        "device",
        "replicas",
        "dev/replica",
        "KV GiB/replica",
        "KV tokens/replica",
        "$/hour",
    ):
        t.add_column(
            col, justify="right" if col[0].isupper() or "/" in col or col == "replicas" else "left"
        )
    for r in placement:
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
    con.print(t)
    for key, title, columns in TIER_TABLES:
        rows = [r for r in placement if f"{key}_gib" in r]
        if not rows:
            continue
        tt = Table(title=title)
        tt.add_column("operator")
        for head, _, _ in columns:
            tt.add_column(head, justify="right")
        for r in rows:
            tt.add_row(r["operator"], *(format(r[f"{key}_{f}"], spec) for _, f, spec in columns))
        con.print(tt)
    con.print(f"total hardware cost: ${p.cost_per_hour():.2f}/hour")
    for name, op in p.operators.items():
        if op.choices:
            other = ", ".join(f"{c.devices_per_replica} x {c.device}" for c in op.choices)
            con.print(f"{name}: `pddflow size` may also give each replica {other}")
    from pddflow.runtime.transports import planned_transports

    dt = Table(title="what `pddflow deploy` runs (the local profile)")
    for col in ("operator", "instances", "ranks (tensor parallel) each", "processes"):
        dt.add_column(col, justify="left" if col == "operator" else "right")
    for row in deployed_layout(p):
        n, ranks = row["instances"], row["ranks_per_instance"]
        dt.add_row(row["operator"], str(n), str(ranks), str(n * ranks))
    con.print(dt)
    tt = Table(title="channels: how `pddflow deploy` carries each edge")
    for col in ("channel", "kind", "--backend local", "--backend ray"):
        tt.add_column(col)
    for row in planned_transports(p):
        tt.add_row(row["channel"], row["kind"], row["local"], row["ray"])
    con.print(tt)
    ld = report.load
    con.print(
        f"\nload: {ld.rps:g} req/s, {ld.prompt_tokens:,} prompt tokens, "
        f"{ld.output_tokens:,} output tokens, {ld.hit_rate:.0%} average prefix hit"
    )
    st = Table(title="load split between decode pools")
    for col in ("pool", "cluster", "share of requests", "from"):
        st.add_column(col, justify="right" if col.startswith("share") else "left")
    for pool in report.pools:
        st.add_row(pool.pool, p.operators[pool.pool].cluster, f"{pool.share:.1%}", pool.why)
    con.print(st)
    for link in report.links:
        lt = Table(
            title=f"link {link.name}: {link.available_gbps:g} Gbps, {link.utilization:.0%} used"
        )
        for col in ("request class", "hit", "KV to send", "transfer P50", "transfer P99"):
            lt.add_column(col, justify="right")
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
    verdict = "[green]FEASIBLE[/green]" if report.feasible else "[red]NOT FEASIBLE[/red]"
    con.print(f"\nverdict: {verdict}")
    for prob in report.problems:
        con.print(f"  [red]problem[/red]: {prob}", markup=True)
    for note in report.notes:
        con.print(f"  note: {note}")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("schema")(schema)
    app.command("viz")(viz)
    app.command("plan")(plan)


def deployed_layout(plan) -> list[dict]:
    """What `pddflow deploy` starts of each operator: instances and rank processes each."""
    local = plan.scaled_to_local()
    return [
        {"operator": op.name, "instances": op.replicas, "ranks_per_instance": op.ranks}
        for op in local.operators.values()
    ]
