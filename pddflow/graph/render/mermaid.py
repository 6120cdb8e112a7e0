"""Mermaid flowchart text (renders in GitHub markdown)."""

from __future__ import annotations

import re

from pddflow.graph.plan import Plan
from pddflow.graph.render.common import edge_label, on_variant, operator_summary


def _id(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", s)


def render(plan: Plan, variant: str | None = None) -> str:
    marked = on_variant(plan, variant)
    path = plan.variants[variant].path if variant else ()
    out = ["flowchart LR"]
    for cluster in plan.clusters.values():
        out.append(f'  subgraph {_id("cluster_" + cluster.name)}["cluster {cluster.name}"]')
        for name, op in plan.operators.items():
            if op.cluster == cluster.name:
                out.append(f'    {_id(name)}["{name}<br/>{operator_summary(plan, name)}"]')
        out.append("  end")
    for i, c in enumerate(plan.channels):
        arrow = "==>" if c.cross_cluster else "-->"
        out.append(f'  {_id(c.src)} {arrow}|"{edge_label(plan, c)}"| {_id(c.dst)}')
        if variant and c.id in marked:
            out.append(f"  linkStyle {i} stroke:crimson,stroke-width:3px")
    for name in path:
        out.append(f"  style {_id(name)} stroke:crimson,stroke-width:3px")
    return "\n".join(out) + "\n"
