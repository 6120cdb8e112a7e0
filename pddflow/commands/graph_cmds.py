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
    from pddflow.commands.plan_output import plan_json, print_plan
    from pddflow.graph.feasibility import Load, analyze

    p = load_or_exit(graph)
    report = analyze(p, Load(rps, prompt_tokens, output_tokens, hit_rate))
    if as_json:
        print(json.dumps(plan_json(str(graph), p, report), indent=2))
    else:
        print_plan(p, report)
    raise typer.Exit(1 if check and not report.feasible else 0)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("schema")(schema)
    app.command("viz")(viz)
    app.command("plan")(plan)
