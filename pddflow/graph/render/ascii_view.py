"""The terminal view: each cluster a box with its operators and internal edges, then each link
with the edges that cross it. `--variant` marks that pipeline's operators and edges with '*'."""

from __future__ import annotations

from pddflow.graph.plan import Plan
from pddflow.graph.render.common import edge_label, on_variant, operator_summary


def render(plan: Plan, variant: str | None = None) -> str:
    marked = on_variant(plan, variant)
    path = set(plan.variants[variant].path) if variant else set()
    out = [f"graph {plan.name}  ({plan.model.weights}; plans as {plan.model.arch.name})"]
    if variant:
        v = plan.variants[variant]
        handoff = f", handoff {v.handoff}" if v.handoff else ""
        out.append(f"variant {variant}: {' -> '.join(v.path)}{handoff}   (* = on this pipeline)")
    for cluster in plan.clusters.values():
        devs = ", ".join(f"{n} x {d}" for d, n in cluster.devices.items())
        lines = []
        for name, op in plan.operators.items():
            if op.cluster == cluster.name:
                mark = "*" if name in path else " "
                lines.append(f"{mark} {name:<12} {operator_summary(plan, name)}")
        inner = [
            c
            for c in plan.channels
            if not c.cross_cluster and plan.operators[c.src].cluster == cluster.name
        ]
        if inner:
            lines.append("")
        for c in inner:
            mark = "*" if c.id in marked else " "
            lines.append(
                f"{mark} {c.src}.{c.src_port} --[{edge_label(plan, c)}]--> {c.dst}.{c.dst_port}"
            )
        out.extend(_box(f"cluster {cluster.name} ({devs})", lines))
    for link in plan.links.values():
        crossing = [c for c in plan.channels if c.link == link.name]
        j = link.jitter
        out.append(
            f"link {link.name}: {link.a} <-> {link.b}  {link.gbps:g} Gbps, RTT {link.rtt_ms:g} ms, "
            f"jitter {j.dist} p50 {j.p50_ms:g} ms / p99 {j.p99_ms:g} ms"
        )
        for c in crossing:
            mark = "*" if c.id in marked else " "
            out.append(f"  {mark} {c.src}.{c.src_port} ==[{c.kind}]==> {c.dst}.{c.dst_port}")
        if not crossing:
            out.append("    (no edge crosses this link)")
    return "\n".join(out) + "\n"


def _box(title: str, lines: list[str]) -> list[str]:
    width = max([len(title) + 4] + [len(s) + 2 for s in lines] + [40])
    top = "+-" + title + " " + "-" * (width - len(title) - 2) + "+"
    body = [f"| {s:<{width - 1}}|" for s in lines] or [f"| {'(no operators)':<{width - 1}}|"]
    return [top, *body, "+" + "-" * width + "+"]
