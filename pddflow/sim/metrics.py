"""Finished flights to the report (JSON-ready dicts): percentiles, goodput, cost, BCR, bytes."""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

from pddflow.core.stats import percentile
from pddflow.graph.load_split import pool_of, pool_shares
from pddflow.sim.flight import LegState, SimFlight

if TYPE_CHECKING:
    from pddflow.sim.simulator import Simulation


def _pcts(values: list[float], scale: float = 1.0, digits: int = 4) -> dict[str, float]:
    v = sorted(x * scale for x in values)
    out = {f"p{q}": round(percentile(v, q), digits) for q in (50, 90, 99)}
    out["mean"] = round(sum(v) / len(v), digits) if v else math.nan
    return out


def ttft(f: SimFlight) -> float:
    return f.first_token_at - f.arrival


def tpot(f: SimFlight) -> float:
    """Seconds per output token after the first, handoff stalls included."""
    n = f.req.output_tokens
    return (f.finished_at - f.first_token_at) / (n - 1) if n > 1 else 0.0


def summarize(sim: Simulation, pricing: dict | None = None) -> dict:
    plan, wl = sim.plan, sim.workload
    flights = sim.flights
    done = [r for r in flights if r.done and not r.failed]
    sla_ttft, sla_tpot = plan.scheduler.ttft_s, plan.scheduler.tpot_ms / 1e3
    ok = [r for r in done if ttft(r) <= sla_ttft and tpot(r) <= sla_tpot]
    lo, hi = steady_window(flights)
    span = max(hi - lo, 1e-9)
    ok_in = [r for r in ok if lo <= r.arrival <= hi]
    cost = plan.cost_per_hour()
    goodput = len(ok_in) / span
    out_tokens = sum(r.req.output_tokens for r in done)
    relay_tokens = sum(r.relay_tokens for r in done)
    wan_bytes = sum(link.bytes_sent for link in sim.links.values())
    full_kv = sum(
        r.req.prompt_tokens * sim.kv_bytes_per_token for r in flights if r.path.wan_link is not None
    )
    variants = Counter(r.decision.variant for r in flights)
    handoffs = Counter(r.handoff for r in done if r.handoff)
    relay_only = sum(
        1 for r in done if r.path.has_handoff and r.handoff is None and not r.decision.singular
    )
    if relay_only:
        handoffs["relay_finished"] = relay_only
    switched = sum(1 for r in done if r.switched)
    if switched:
        handoffs["switched_to_one_shot"] = switched  # counted under one_shot as well
    hit_pred = [r.decision.predicted_hit for r in flights]
    hit_real = [
        min(r.main.hit_blocks * sim.block_tokens, r.req.prompt_tokens) / r.req.prompt_tokens
        for r in flights
        if r.main.state in (LegState.LANDED, LegState.RELEASED)
    ]
    busy = Counter()
    count = Counter()
    for iid, eng in sim.engines.items():
        op = plan.instance(iid).operator
        busy[op] += eng.busy_s
        count[op] += 1
    horizon = max((r.finished_at for r in done), default=span) or span
    result = {
        "graph": plan.name,
        "source": plan.source,
        "workload": wl.name,
        "requests": len(flights),
        "completed": len(done),
        "failed": len(flights) - len(done),
        "wall_s": round(sim.wall_s, 3),
        "events": sim.loop.processed,
        "simulated_s": round(horizon, 3),
        "ttft_s": _pcts([ttft(r) for r in done]),
        "tpot_ms": _pcts([tpot(r) for r in done], 1e3, 3),
        "sla": {"ttft_s": sla_ttft, "tpot_ms": plan.scheduler.tpot_ms},
        "sla_attainment": round(len(ok) / max(len(flights), 1), 4),
        "throughput_rps": round(sum(1 for r in done if lo <= r.arrival <= hi) / span, 4),
        "rate_window_s": [round(lo, 3), round(hi, 3)],
        "slo_goodput_rps": round(goodput, 4),
        "cost_per_hour": round(cost, 3),
        "gpus": sum(op.replicas * op.devices_per_replica for op in plan.operators.values()),
        # SLA-compliant requests per dollar
        "bcr": round(goodput * 3600 / cost, 4) if cost else math.nan,
        "wan_bytes": round(wan_bytes),
        "wan_bytes_full_kv": round(full_kv),
        # over the whole run: copies to main may still cross after the last request finished
        "wan_gbps_avg": round(wan_bytes * 8 / 1e9 / max(horizon, sim.loop.now), 3),
        "wan_transfer_s": _pcts(
            [
                r.main.transfer_s
                for r in flights
                if r.main.transfer_s is not None and r.path.wan_link
            ]
        ),
        "relay_token_share": round(relay_tokens / out_tokens, 4) if out_tokens else 0.0,
        "variants": dict(sorted(variants.items())),
        "pools": _pools(plan, variants),
        "handoffs": dict(sorted(handoffs.items())),
        "singular": sum(1 for r in flights if r.decision.singular),
        "hit_rate": {
            "predicted_mean": round(sum(hit_pred) / max(len(hit_pred), 1), 4),
            "at_transfer_mean": round(sum(hit_real) / len(hit_real), 4) if hit_real else None,
            "workload_unbounded_mean": round(
                sum(h := wl.unbounded_hit_rates()) / max(len(h), 1), 4
            ),
        },
        "utilization": {op: round(busy[op] / (count[op] * horizon), 4) for op in sorted(busy)},
        # as `pddflow bench serve` reports its workers': decode steps and the sequences they carried
        "decode_steps": {
            iid: {"steps": e.steps, "seqs": e.decode_tokens}
            for iid, e in sorted(sim.engines.items())
            if e.decode_tokens
        },
        "per_variant": {
            v: {
                "requests": sum(1 for r in done if r.decision.variant == v),
                "ttft_s": _pcts([ttft(r) for r in done if r.decision.variant == v]),
            }
            for v in sorted(variants)
        },
    }
    hours = max(horizon, sim.loop.now) / 3600
    result["device_hours"] = round(result["gpus"] * hours, 4)
    if sim.elastic is not None:
        _elastic(sim, result, hours, goodput)
    tiers = host_tiers(sim)
    if tiers:  # only with a tier bought: outputs without one stay as they were
        result["host_tiers"] = tiers
    if pricing:
        result["revenue"] = revenue(sim, ok_in, span, pricing)
    return result


def _elastic(sim: Simulation, result: dict, hours: float, goodput: float) -> None:
    """The planner's run: what its devices cost while they were up, and its decisions; `gpus`
    and `cost_per_hour` become their means over the run."""
    plan, until = sim.plan, hours * 3600
    used = sim.elastic.device_seconds(until)
    usd = sum(
        s / 3600 * plan.device_classes[plan.instance(i).device].usd_per_hour
        for i, s in used.items()
    )
    result["device_hours"] = round(sum(used.values()) / 3600, 4)
    result["gpus"] = round(sum(used.values()) / max(until, 1e-9), 3)
    result["cost_per_hour"] = round(usd / max(hours, 1e-12), 3)
    result["bcr"] = round(goodput * 3600 / result["cost_per_hour"], 4) if usd else math.nan
    result["planner"] = sim.elastic.report(until)


def host_tiers(sim: Simulation) -> dict[str, dict]:
    """Per operator with a host (or disk) tier bought: its size and what its replicas' tiers did;
    a disk tier's row is keyed `OPERATOR (disk)`."""
    out: dict[str, dict] = {}
    for iid, st in sim.stores.items():
        op = sim.plan.operator_of(iid)
        for name, tier, cache in (
            (op.name, st.host, op.host_cache),
            (f"{op.name} (disk)", st.disk, op.disk_cache),
        ):
            if tier is None:
                continue
            row = out.setdefault(
                name,
                {
                    "gib_per_replica": cache.gib,
                    "usd_per_hour": round(op.replicas * cache.usd_per_replica_hour, 4),
                    "loaded_blocks": 0,
                    "dropped_blocks": 0,
                    "load_s": 0.0,
                },
            )
            row["loaded_blocks"] += tier.loaded_blocks
            row["dropped_blocks"] += tier.dropped_blocks
            row["load_s"] = round(row["load_s"] + tier.load_s, 4)
    return out


def request_rows(sim: Simulation) -> list[dict]:
    """`--per-request` rows, in simulated seconds, keyed as `bench serve --per-request`'s."""

    def t(x: float | None) -> float | None:
        return None if x is None else round(x, 4)

    def since(r: SimFlight, x: float | None) -> float | None:
        return None if x is None else round(x - r.arrival, 4)

    rows = []
    for r in sorted(sim.flights, key=lambda r: (r.req.session, r.req.turn, r.req.rid)):
        fin, relay = r.main, r.relay
        started = r.prefill_started_at
        rows.append(
            {
                "rid": r.req.rid,
                "session": r.req.session,
                "turn": r.req.turn,
                "start_s": t(r.arrival),
                "prompt_tokens": r.req.prompt_tokens,
                "output_tokens": r.req.output_tokens,
                "ttft_s": since(r, r.first_token_at),
                "e2e_s": since(r, r.finished_at),
                "variant": r.decision.variant,
                "handoff": r.handoff,
                "relay_tokens": r.relay_tokens,
                "prefill_hit_tokens": r.prefill.hit_tokens,
                "prefill_done_s": since(r, r.prefill_done_at),
                # as the runtime's kv_send event: waiting for the prefill engine, then computing
                "prefill_queued_s": since(r, started),
                "prefill_s": t(r.prefill_done_at - started) if started is not None else None,
                "kv_bytes": round(fin.bytes),
                "kv_hit_blocks": fin.hit_blocks,
                "kv_sent_s": since(r, fin.sent_at) if fin.transfer_s is not None else None,
                "kv_transfer_s": t(fin.transfer_s),
                # as the relay's kv_landed event: its copy reached the relay, its loop took it
                "relay_kv_sent_s": since(r, relay.landed_at),
                "relay_kv_landed_s": since(r, relay.started_at),
                # as the runtime's kv_waits_for_memory events: landed KV waiting for memory
                "memory_waits": r.memory_waits,
                "memory_wait_s": t(r.memory_wait_s),
                "failed": r.failed,
            }
        )
    return rows


def steady_window(flights: list[SimFlight], trim: float = 0.05) -> tuple[float, float]:
    """Arrival window of the rates, without the first and last `trim` (ramp-up, drain)."""
    arr = sorted(r.arrival for r in flights)
    if not arr:
        return 0.0, 0.0
    if len(arr) < 40:
        return arr[0], arr[-1]
    return arr[int(trim * len(arr))], arr[int((1 - trim) * len(arr)) - 1]


def revenue(sim: Simulation, ok: list[SimFlight], span_s: float, pricing: dict) -> dict:
    """Revenue of the SLA-compliant requests `ok`; cached prompt tokens at `cached_ratio`."""
    pin, pout, ratio = (
        pricing["input_per_mtok"],
        pricing["output_per_mtok"],
        pricing["cached_ratio"],
    )
    total = 0.0
    for r in ok:
        cached = min(r.prefill.hit_tokens, r.req.prompt_tokens)
        total += (
            (r.req.prompt_tokens - cached) + cached * ratio
        ) * pin + r.req.output_tokens * pout
    total /= 1e6
    span_h = max(span_s, 1e-9) / 3600
    gpu_h = sum(op.replicas * op.devices_per_replica for op in sim.plan.operators.values()) * span_h
    return {
        "usd": round(total, 4),
        "usd_per_gpu_hour": round(total / gpu_h, 4),
        "usd_per_cost_usd": round(total / (sim.plan.cost_per_hour() * span_h), 4),
        **pricing,
    }


def _pools(plan, variants: Counter) -> dict[str, dict]:
    """Requests per decode pool as the scheduler sent them, beside `plan`'s rule (load_split.py)."""
    total = max(sum(variants.values()), 1)
    served = Counter()
    for v, n in variants.items():
        served[pool_of(plan, v)] += n
    return {
        pool: {
            "requests": served[pool],
            "share": round(served[pool] / total, 4),
            "plan_share": round(rule.share, 4),
        }
        for pool, rule in pool_shares(plan).items()
    }
