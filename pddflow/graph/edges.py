"""Edge checks: ports and payload types, channel kind against placement, the link each
cross-cluster edge takes, inputs nothing feeds, and cycles."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pddflow.core.channel_kinds import CHANNEL_KINDS
from pddflow.core.payloads import Payload
from pddflow.core.registry import did_you_mean
from pddflow.graph.params import check_params
from pddflow.graph.plan import ChannelPlan, OperatorPlan
from pddflow.graph.resolved import Resolved


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


@dataclass(frozen=True)
class Edges:
    """What the edge checks found."""

    channels: tuple[ChannelPlan, ...]  # the valid edges, bound to their kind and link
    valid: EdgeIndex  # the same as an index: what the Plan and the variants' channels use
    declared: EdgeIndex  # every edge whose endpoints exist, valid or not
    fed: frozenset[tuple[str, str]]  # (operator, input port) some edge declares it feeds


def check_edges(r: Resolved, ops: dict[str, OperatorPlan]) -> Edges:
    """Every edge checked and bound to its channel kind and link."""
    out: list[ChannelPlan] = []
    seen: set[str] = set()
    valid, declared = EdgeIndex(), EdgeIndex()
    fed: set[tuple[str, str]] = set()
    for i, e in enumerate(r.spec.edges):
        at = ("edges", i)
        src = _endpoint(r, at + ("from",), e.from_, "outputs")
        dst = _endpoint(r, at + ("to",), e.to, "inputs")
        kind = None
        if e.channel not in CHANNEL_KINDS:
            r.err(
                at + ("channel",),
                f"unknown channel kind {e.channel!r}"
                f"{did_you_mean(e.channel, CHANNEL_KINDS.names())}; "
                f"kinds: {', '.join(CHANNEL_KINDS.names())}",
            )
        else:
            kind = CHANNEL_KINDS.get(e.channel)
        if dst:
            fed.add((dst[0], dst[1]))
        if src and dst:
            declared.add(src[0], dst[0], f"{e.from_}->{e.to}", payload=str(src[2]))
        if not (src and dst and kind):
            continue
        (s_op, s_port, s_type), (d_op, d_port, d_type) = src, dst
        if s_type != d_type:
            r.err(
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
            r.err(
                at + ("channel",),
                f"channel {kind.name} carries {', '.join(sorted(map(str, kind.carries)))} but "
                f"{e.from_} sends {s_type}; use {' or '.join(fits)}",
            )
            continue
        a, b = ops[s_op].cluster, ops[d_op].cluster
        cross = a != b
        link_name = None
        if cross and not kind.can_cross_clusters():
            r.err(
                at + ("channel",),
                f"{kind.name} cannot cross clusters ({kind.scope} scope), but {s_op} is in "
                f"cluster {a} and {d_op} in cluster {b}; "
                "use wan_flight for KV between datacenters",
            )
            continue
        if kind.scope == "process" and s_op != d_op:
            r.err(
                at + ("channel",),
                f"channel local only joins ports inside one process, but {s_op} and {d_op} "
                "are separate operators; use rdma_tensor, wan_flight or token_ids",
            )
            continue
        if cross:
            link_name = _edge_link(r, at, e.link, a, b)
            if link_name is None:
                continue
        elif e.link is not None:
            r.err(
                at + ("link",),
                f"{s_op} and {d_op} are both in cluster {a}; an intra-cluster edge crosses no link",
            )
        params = check_params(
            r.src, at + ("params",), kind.params, e.params, f"channel {kind.name}"
        )
        cid = f"{s_op}.{s_port}->{d_op}.{d_port}"
        if cid in seen:
            r.err(at, f"edge {cid} is declared twice; delete one", key=False)
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
        valid.add(s_op, d_op, cid, kind=kind.name, payload=str(s_type))
    return Edges(tuple(out), valid, declared, frozenset(fed))


def _endpoint(r: Resolved, at: tuple, ref: str, side: str) -> tuple[str, str, Payload] | None:
    if ref.count(".") != 1 or not all(ref.split(".")):
        r.err(at, f"{ref!r} is not `operator.port` (for example `prefill.kv`)")
        return None
    op, port = ref.split(".")
    if op not in r.spec.operators:
        r.err(
            at,
            f"no operator named {op!r}{did_you_mean(op, r.spec.operators)}; operators: "
            f"{', '.join(r.spec.operators)}",
        )
        return None
    optype = r.types.get(op)
    if optype is None:  # its own definition is already reported
        return None
    ports = getattr(optype, side)
    if port not in ports:
        other = optype.inputs if side == "outputs" else optype.outputs
        if port in other:
            where = "an input" if side == "outputs" else "an output"
            r.err(
                at,
                f"{op}.{port} is {where} of {optype.name}; edges go from an output to an input",
            )
        else:
            listed = ", ".join(f"{p} ({t})" for p, t in ports.items())
            r.err(
                at,
                f"{optype.name} operator {op} has no {side[:-1]} port {port!r}"
                f"{did_you_mean(port, ports)}; its {side}: {listed}",
            )
        return None
    return op, port, ports[port]


def _edge_link(r: Resolved, at: tuple, declared: str | None, a: str, b: str) -> str | None:
    if declared is not None:
        link = r.links.get(declared)
        if link is None:
            if declared not in r.spec.links:
                r.err(
                    at + ("link",),
                    f"no link named {declared!r}{did_you_mean(declared, r.spec.links)}",
                )
            return None
        if not link.connects(a, b):
            r.err(at + ("link",), f"link {declared} joins {link.a} and {link.b}, not {a} and {b}")
            return None
        return declared
    for name, link in r.links.items():
        if link.connects(a, b):
            return name
    r.err(
        at,
        f"this edge crosses from cluster {a} to cluster {b} but no link joins them; add "
        f"`links: {{{a}-{b}: {{gbps: 100, rtt_ms: 30}}}}`",
    )
    return None


def check_unfed_inputs(
    r: Resolved, ops: dict[str, OperatorPlan], fed: frozenset[tuple[str, str]]
) -> None:
    for name in ops:
        for port, payload in r.types[name].inputs.items():
            if payload == Payload.KV_BLOCKS and (name, port) not in fed:
                r.err(
                    ("operators", name),
                    f"{name}.{port} takes {payload} but no edge feeds it; add an edge "
                    f"`{{from: <prefill>.kv, to: {name}.{port}, channel: ...}}` "
                    "(rdma_tensor inside a cluster, wan_flight across clusters)",
                    key=True,
                )


def check_cycles(r: Resolved, valid: EdgeIndex) -> None:
    for cycle in valid.cycles():
        first = next(i for i, e in enumerate(r.spec.edges) if e.from_.split(".")[0] == cycle[0])
        r.err(
            ("edges", first),
            f"edges form a cycle {' -> '.join(cycle + [cycle[0]])}; a pipeline flows one way "
            "(prefill -> relay -> main)",
        )
