"""Variant checks: each variant is a path of real edges from a prefilling operator to a decoder,
with a handoff mode where a relay hands over to a main decoder."""

from __future__ import annotations

from pddflow.core.operator_types import OPERATOR_TYPES
from pddflow.core.payloads import Payload
from pddflow.core.registry import did_you_mean
from pddflow.graph.edges import Edges
from pddflow.graph.plan import OperatorPlan, VariantPlan
from pddflow.graph.resolved import Resolved
from pddflow.graph.spec import VariantSpec


def check_variants(
    r: Resolved, ops: dict[str, OperatorPlan], edges: Edges
) -> dict[str, VariantPlan]:
    out = {}
    for name, spec in r.spec.variants.items():
        plan = _variant(r, edges, name, spec, ops)
        if plan is not None:
            out[name] = plan
    shares = [v.expected_share for v in r.spec.variants.values() if v.expected_share is not None]
    if shares and sum(shares) > 1.0 + 1e-9:
        r.err(("variants",), f"expected_share values add up to {sum(shares):.2f}, more than 1")
    return out


def _variant(
    r: Resolved, edges: Edges, name: str, v: VariantSpec, ops: dict[str, OperatorPlan]
) -> VariantPlan | None:
    at = ("variants", name)
    missing = [p for p in v.path if p not in r.spec.operators]
    for p in missing:
        i = v.path.index(p)
        r.err(
            at + ("path", i),
            f"variant {name}: no operator named {p!r}{did_you_mean(p, r.spec.operators)}",
        )
    if missing or any(p not in ops for p in v.path):
        return None
    if len(set(v.path)) != len(v.path):
        r.err(at + ("path",), f"variant {name} visits an operator twice: {v.path}")
        return None
    first, last = r.types[v.path[0]], r.types[v.path[-1]]
    if not first.prefills:
        entries = " or ".join(t for t in OPERATOR_TYPES.names() if OPERATOR_TYPES.get(t).prefills)
        r.err(
            at + ("path", 0),
            f"variant {name} starts at {v.path[0]} ({first.name}), which does not take "
            f"requests; start at a {entries} operator",
        )
    if not last.decodes:
        r.err(
            at + ("path", len(v.path) - 1),
            f"variant {name} ends at {v.path[-1]} ({last.name}), which does "
            "not decode; a pipeline ends at a decode operator",
        )
    ok = True
    for i, (a, b) in enumerate(zip(v.path, v.path[1:])):
        if not edges.declared.has(a, b):
            ok = False
            r.err(
                at + ("path", i + 1),
                f"variant {name} goes {a} -> {b} but no edge joins them; add an edge "
                f"from {a} to {b} (for KV: `{{from: {a}.kv, to: {b}.kv, channel: ...}}`)",
            )
    relays = [p for p in v.path if r.types[p].relays]
    ends_at_relay = last.relays
    if ends_at_relay and not v.singular_traffic:
        r.err(
            at + ("path",),
            f"variant {name} ends at the relay ({v.path[-1]}): a P-RLD pipeline lets MD's cache "
            "drift from P's and overloads the relay (PDD.md); end at a main decoder, or mark it "
            "`singular_traffic: true` if it is the rare long-input, short-output exception",
        )
    if v.singular_traffic and not ends_at_relay:
        r.err(
            at + ("singular_traffic",),
            f"variant {name} is marked singular_traffic but does not end at a relay",
        )
    handing_off = bool(relays) and not ends_at_relay
    if handing_off and v.handoff is None:
        r.err(
            at + ("path",),
            f"variant {name} passes through relay {relays[0]}; say how it hands off: "
            "`handoff: one_shot | catch_up | adaptive`",
        )
    if v.handoff is not None and not handing_off:
        r.err(
            at + ("handoff",),
            f"variant {name} has no relay handing off to a main decoder, so "
            f"`handoff: {v.handoff}` has no effect; remove it",
        )
    if handing_off:
        relay = relays[0]
        nxt = v.path[v.path.index(relay) + 1]
        joins = edges.declared.between(relay, nxt).values()
        if not any(d["payload"] == str(Payload.TOKEN_IDS) for d in joins):
            ok = False
            r.err(
                at + ("path",),
                f"variant {name} hands off from {relay} to {nxt} but no TokenIds edge joins "
                f"them; add `{{from: {relay}.handoff, to: {nxt}.handoff, channel: token_ids}}`",
            )
    if not ok or not all(edges.valid.has(a, b) for a, b in zip(v.path, v.path[1:])):
        return None  # reported above, or at the invalid edge itself
    chans = tuple(
        c for i, a in enumerate(v.path) for b in v.path[i + 1 :] for c in edges.valid.between(a, b)
    )
    relay_params = ops[relays[0]].params if relays else {}
    catch_up = relay_params.get("catch_up_tokens", 32)
    min_extend = relay_params.get("min_extend_tokens", 8)
    if min_extend > catch_up:
        r.err(
            ("operators", relays[0], "params", "min_extend_tokens"),
            f"min_extend_tokens ({min_extend}) must be <= catch_up_tokens ({catch_up}): a "
            "catch-up batch is never smaller than the smallest extend",
        )
    return VariantPlan(
        name,
        tuple(v.path),
        chans,
        v.handoff,
        catch_up,
        min_extend,
        v.singular_traffic,
        v.expected_share,
    )
