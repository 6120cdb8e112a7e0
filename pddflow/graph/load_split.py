"""How a plan's load splits between its decode pools (the operator each variant ends at) and its
variants: one rule for `plan`'s bandwidth arithmetic and `simulate`'s table, which shows it beside
the split the scheduler made request by request.

Declared `expected_share`s are taken as they are. The load they leave splits between the pools of
the undeclared variants in proportion to each pool's decode capacity (devices x HBM bandwidth:
decoding is bound by memory bandwidth), which is where a scheduler that balances load settles once
the pools are busy. Inside a pool, any undeclared variant may carry all of the pool's part (the
policy picks per request): the worst case for each channel."""

from __future__ import annotations

from dataclasses import dataclass

from pddflow.graph.plan import Plan


@dataclass(frozen=True)
class PoolShare:
    pool: str  # the operator its variants end at
    share: float  # of all requests
    why: str
    undeclared: float = 0.0  # the part no expected_share declares: any open variant may carry it


def pool_of(plan: Plan, variant: str) -> str:
    return plan.variants[variant].path[-1]


def pool_shares(plan: Plan) -> dict[str, PoolShare]:
    declared: dict[str, float] = {}
    open_pools: dict[str, float] = {}  # pool -> decode capacity, for its undeclared variants
    for name, v in plan.variants.items():
        pool = pool_of(plan, name)
        declared.setdefault(pool, 0.0)
        if v.expected_share is not None:
            declared[pool] += v.expected_share
        else:
            op = plan.operators[pool]
            tbps = plan.device_classes[op.device].hbm_tbps
            open_pools[pool] = op.replicas * op.devices_per_replica * tbps
    rest = max(0.0, 1.0 - sum(declared.values()))
    capacity = sum(open_pools.values())
    out = {}
    for pool, fixed in declared.items():
        part = rest * open_pools[pool] / capacity if pool in open_pools and capacity else 0.0
        if pool not in open_pools:
            why = "declared expected_share"
        elif len(open_pools) == 1:
            why = "the load no expected_share declares"
        else:
            why = f"decode capacity {open_pools[pool]:g} of {capacity:g} TB/s"
        if pool in open_pools and fixed:
            why = f"declared {fixed:.0%} + {why}"
        out[pool] = PoolShare(pool, fixed + part, why, part)
    return out


def variant_shares(plan: Plan, pools: dict[str, PoolShare] | None = None) -> dict[str, float]:
    """Each variant's most: its declared share, else all of its pool's undeclared part."""
    pools = pools if pools is not None else pool_shares(plan)
    return {
        name: v.expected_share
        if v.expected_share is not None
        else pools[pool_of(plan, name)].undeclared
        for name, v in plan.variants.items()
    }


def channel_share(plan: Plan, channel_id: str) -> float:
    """The most of all requests that may cross `channel_id`: per pool, its variants that use the
    channel, capped at the pool's share."""
    pools = pool_shares(plan)
    shares = variant_shares(plan, pools)
    used: dict[str, float] = {}
    for name, v in plan.variants.items():
        if channel_id in v.channels:
            pool = pool_of(plan, name)
            used[pool] = used.get(pool, 0.0) + shares[name]
    return sum(min(pools[p].share, s) for p, s in used.items())
