"""Edge checks: ports and payload types, channel kind against placement, the link each
cross-cluster edge takes, inputs nothing feeds, and cycles."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pddflow.core.channel_kinds import CHANNEL_KINDS
from pddflow.core.payloads import Payload
from pddflow.core.registry import did_you_mean
from pddflow.graph.params import check_params
from pddflow.graph.plan import ChannelPlan, OperatorPlan

if TYPE_CHECKING:
    from pddflow.graph.compile import Compiler


class EdgeIndex:
    """Operator-to-operator edges keyed by edge id; not networkx, whose import alone would make
    validating a graph slow."""

    def __init__(self) -> None:
        self._out: dict[str, dict[str, dict[str, dict]]] = {}

    def add(self, src: str, dst: str, key: str, **data: Any) -> None:
        self._out.setdefault(src, {}).setdefault(dst, {})[key] = data

    def has(self, src: str, dst: str) -> bool:
        return bool(self._out.get(src, {}).get(dst))

    def between(self, src: str, dst: str) -> dict[str, dict]:
        return self._out.get(src, {}).get(dst, {})

    def cycles(self) -> list[list[str]]:
        """One cycle per back edge of a depth-first search: enough to report each loop."""
        found, state, stack = [], {}, []

        def visit(n: str) -> None:
            state[n] = 1
            stack.append(n)
            for m in self._out.get(n, {}):
                if state.get(m) == 1:
                    found.append(stack[stack.index(m) :])
                elif m not in state:
                    visit(m)
            stack.pop()
            state[n] = 2

        for n in list(self._out):
            if n not in state:
                visit(n)
        return found


def check_edges(comp: Compiler, ops: dict[str, OperatorPlan]) -> list[ChannelPlan]:
    """Every edge checked and bound to its channel kind and link; valid ones go to comp.graph."""
    out: list[ChannelPlan] = []
    seen: set[str] = set()
    for i, e in enumerate(comp.spec.edges):
        at = ("edges", i)
        src = _endpoint(comp, at + ("from",), e.from_, "outputs")
        dst = _endpoint(comp, at + ("to",), e.to, "inputs")
        kind = None
        if e.channel not in CHANNEL_KINDS:
            comp.err(
                at + ("channel",),
                f"unknown channel kind {e.channel!r}"
                f"{did_you_mean(e.channel, CHANNEL_KINDS.names())}; "
                f"kinds: {', '.join(CHANNEL_KINDS.names())}",
            )
        else:
            kind = CHANNEL_KINDS.get(e.channel)
        if dst:
            comp.declared_inputs.add((dst[0], dst[1]))
        if src and dst:
            comp.declared.add(src[0], dst[0], f"{e.from_}->{e.to}", payload=str(src[2]))
        if not (src and dst and kind):
            continue
        (s_op, s_port, s_type), (d_op, d_port, d_type) = src, dst
        if s_type != d_type:
            comp.err(
                at + ("to",),
                f"type mismatch: {e.from_} sends {s_type} but {e.to} takes {d_type}",
            )
            continue
        if s_type not in kind.carries:
            fits = [
                k
                for k in CHANNEL_KINDS.names()
                if s_type in CHANNEL_KINDS.get(k).carries and k != "local"
            ]
            comp.err(
                at + ("channel",),
                f"channel {kind.name} carries {', '.join(sorted(map(str, kind.carries)))} but "
                f"{e.from_} sends {s_type}; use {' or '.join(fits)}",
            )
            continue
        a, b = ops[s_op].cluster, ops[d_op].cluster
        cross = a != b
        link_name = None
        if cross and not kind.can_cross_clusters():
            comp.err(
                at + ("channel",),
                f"{kind.name} cannot cross clusters ({kind.scope} scope), but {s_op} is in "
                f"cluster {a} and {d_op} in cluster {b}; "
                "use wan_flight for KV between datacenters",
            )
            continue
        if kind.scope == "process" and s_op != d_op:
            comp.err(
                at + ("channel",),
                f"channel local only joins ports inside one process, but {s_op} and {d_op} "
                "are separate operators; use rdma_tensor, wan_flight or token_ids",
            )
            continue
        if cross:
            link_name = _edge_link(comp, at, e.link, a, b)
            if link_name is None:
                continue
        elif e.link is not None:
            comp.err(
                at + ("link",),
                f"{s_op} and {d_op} are both in cluster {a}; an intra-cluster edge crosses no link",
            )
        params = check_params(
            comp.src, at + ("params",), kind.params, e.params, f"channel {kind.name}"
        )
        cid = f"{s_op}.{s_port}->{d_op}.{d_port}"
        if cid in seen:
            comp.err(at, f"edge {cid} is declared twice; delete one", key=False)
            continue
        seen.add(cid)
        out.append(
            ChannelPlan(
                cid,
                kind.name,
                str(s_type),
                s_op,
                s_port,
                d_op,
                d_port,
                cross,
                link_name,
                params,
            )
        )
        comp.graph.add(s_op, d_op, cid, kind=kind.name, payload=str(s_type))
    return out


def _endpoint(comp: Compiler, at: tuple, ref: str, side: str) -> tuple[str, str, Payload] | None:
    if ref.count(".") != 1 or not all(ref.split(".")):
        comp.err(at, f"{ref!r} is not `operator.port` (for example `prefill.kv`)")
        return None
    op, port = ref.split(".")
    if op not in comp.spec.operators:
        comp.err(
            at,
            f"no operator named {op!r}{did_you_mean(op, comp.spec.operators)}; operators: "
            f"{', '.join(comp.spec.operators)}",
        )
        return None
    optype = comp.types.get(op)
    if optype is None:  # its own definition is already reported
        return None
    ports = getattr(optype, side)
    if port not in ports:
        other = optype.inputs if side == "outputs" else optype.outputs
        if port in other:
            where = "an input" if side == "outputs" else "an output"
            comp.err(
                at,
                f"{op}.{port} is {where} of {optype.name}; edges go from an output to an input",
            )
        else:
            listed = ", ".join(f"{p} ({t})" for p, t in ports.items())
            comp.err(
                at,
                f"{optype.name} operator {op} has no {side[:-1]} port {port!r}"
                f"{did_you_mean(port, ports)}; its {side}: {listed}",
            )
        return None
    return op, port, ports[port]


def _edge_link(comp: Compiler, at: tuple, declared: str | None, a: str, b: str) -> str | None:
    if declared is not None:
        link = comp.links.get(declared)
        if link is None:
            if declared not in comp.spec.links:
                comp.err(
                    at + ("link",),
                    f"no link named {declared!r}{did_you_mean(declared, comp.spec.links)}",
                )
            return None
        if not link.connects(a, b):
            comp.err(
                at + ("link",), f"link {declared} joins {link.a} and {link.b}, not {a} and {b}"
            )
            return None
        return declared
    for name, link in comp.links.items():
        if link.connects(a, b):
            return name
    comp.err(
        at,
        f"this edge crosses from cluster {a} to cluster {b} but no link joins them; add "
        f"`links: {{{a}-{b}: {{gbps: 100, rtt_ms: 30}}}}`",
    )
    return None


def check_unfed_inputs(comp: Compiler, ops: dict[str, OperatorPlan]) -> None:
    fed = comp.declared_inputs
    for name in ops:
        for port, payload in comp.types[name].inputs.items():
            if payload == Payload.KV_BLOCKS and (name, port) not in fed:
                comp.err(
                    ("operators", name),
                    f"{name}.{port} takes {payload} but no edge feeds it; add an edge "
                    f"`{{from: <prefill>.kv, to: {name}.{port}, channel: ...}}` "
                    "(rdma_tensor inside a cluster, wan_flight across clusters)",
                    key=True,
                )


def check_cycles(comp: Compiler) -> None:
    for cycle in comp.graph.cycles():
        first = next(i for i, e in enumerate(comp.spec.edges) if e.from_.split(".")[0] == cycle[0])
        comp.err(
            ("edges", first),
            f"edges form a cycle {' -> '.join(cycle + [cycle[0]])}; a pipeline flows one way "
            "(prefill -> relay -> main)",
        )
