"""Graphviz DOT (text) and SVG (through Graphviz's `dot`, when installed)."""

from __future__ import annotations

import shutil
import subprocess

from pddflow.graph.plan import Plan
from pddflow.graph.render.common import RenderError, edge_label, on_variant, operator_summary

NEWLINE = "\\n"  # DOT's line break inside a label


def _q(s: str) -> str:
    return '"' + s.replace('"', '\\"') + '"'


def render(plan: Plan, variant: str | None = None) -> str:
    marked = on_variant(plan, variant)
    path = set(plan.variants[variant].path) if variant else set()
    out = [
        f"digraph {_q(plan.name)} {{",
        "  rankdir=LR;",
        "  node [shape=box, style=rounded, fontname=Helvetica];",
        "  edge [fontname=Helvetica, fontsize=10];",
    ]
    for cluster in plan.clusters.values():
        devs = ", ".join(f"{n} x {d}" for d, n in cluster.devices.items())
        out.append(f"  subgraph {_q('cluster_' + cluster.name)} {{")
        out.append(f"    label={_q(f'cluster {cluster.name} ({devs})')};")
        for name, op in plan.operators.items():
            if op.cluster == cluster.name:
                style = ", penwidth=2.5, color=crimson" if name in path else ""
                label = _q(name + NEWLINE + operator_summary(plan, name))
                out.append(f"    {_q(name)} [label={label}{style}];")
        out.append("  }")
    for c in plan.channels:
        attrs = [f"label={_q(edge_label(plan, c))}"]
        if c.cross_cluster:
            attrs.append("style=bold")
        if variant:
            attrs.append(
                "color=crimson, penwidth=2.5"
                if c.id in marked
                else "color=gray70, fontcolor=gray50"
            )
        out.append(f"  {_q(c.src)} -> {_q(c.dst)} [{', '.join(attrs)}];")
    out.append("}")
    return "\n".join(out) + "\n"


def render_svg(plan: Plan, variant: str | None = None) -> str:
    exe = shutil.which("dot")
    if exe is None:
        raise RenderError(
            "SVG needs Graphviz's `dot`, which is not installed: `apt-get install graphviz` "
            "(or `brew install graphviz`), or use `--format dot` and render it elsewhere"
        )
    try:
        done = subprocess.run(
            [exe, "-Tsvg"],
            input=render(plan, variant),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RenderError("Graphviz's dot did not finish within 30 s") from None
    if done.returncode != 0:
        raise RenderError(f"Graphviz's dot failed: {done.stderr.strip()}")
    return done.stdout
