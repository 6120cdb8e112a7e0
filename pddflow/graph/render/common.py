"""What every renderer shares: the formats, the error they raise and the labels they print."""

from __future__ import annotations

from pddflow.graph.plan import ChannelPlan, Plan

FORMATS = ("ascii", "dot", "mermaid", "svg")


class RenderError(Exception):
    """A renderer could not run (for svg: Graphviz is missing); the message says how to fix it."""


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
