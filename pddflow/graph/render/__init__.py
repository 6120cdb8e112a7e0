"""Renderers of a Plan: ascii (the terminal view), dot, mermaid and svg (through Graphviz)."""

from __future__ import annotations

from pddflow.graph.plan import ChannelPlan, Plan

FORMATS = ("ascii", "dot", "mermaid", "svg")


class RenderError(Exception):
    """A renderer could not run (for svg: Graphviz is missing); the message says how to fix it."""


def render(plan: Plan, fmt: str = "ascii", variant: str | None = None) -> str:
    from pddflow.graph.render import ascii_view, dot, mermaid  # noqa: PLC0415 (cheap, local modules)

    if fmt == "ascii":
        return ascii_view.render(plan, variant)
    if fmt == "dot":
        return dot.render(plan, variant)
    if fmt == "mermaid":
        return mermaid.render(plan, variant)
    if fmt == "svg":
        return dot.render_svg(plan, variant)
    raise RenderError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")


def edge_label(plan: Plan, ch: ChannelPlan) -> str:
    """Channel kind plus the bandwidth it runs at: the link's for WAN edges, the fabric's inside."""
    if ch.cross_cluster and ch.link:
        return f"{ch.kind} {plan.links[ch.link].gbps:g} Gbps ({ch.link})"
    return f"{ch.kind} {plan.clusters[plan.operators[ch.src].cluster].rdma_gbps:g} Gbps"


def on_variant(plan: Plan, variant: str | None) -> set[str]:
    return set(plan.variants[variant].channels) if variant else set()


def operator_summary(plan: Plan, name: str) -> str:
    op = plan.operators[name]
    return f"{op.op_type} {op.replicas}x{op.devices_per_replica} {op.device}"
