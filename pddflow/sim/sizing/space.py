"""The candidates of `pddflow size`: a replica count per operator (and, with host tiers, the
tiers' rung), the ones a plan's devices and a budget allow, their cost, and the plan each one
stands for."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from pddflow.graph.plan import Plan, _instances
from pddflow.sim.host_tier import ladder, tiered

# one count per operator, in the plan's operator order, then the host-tier rung when there is one
Replicas = tuple[int, ...]


def with_replicas(plan: Plan, replicas: dict[str, int]) -> Plan:
    ops = {}
    for name, op in plan.operators.items():
        n = replicas.get(name, op.replicas)
        ops[name] = replace(op, replicas=n, instances=tuple(f"{name}/{i}" for i in range(n)))
    return replace(plan, operators=ops, instances=_instances(ops))


def shape_combos(plan: Plan) -> list[tuple[int, ...]]:
    """Every combination of one shape per operator (indices into `OperatorPlan.shapes()`), the
    graph's declared shapes first."""
    return list(itertools.product(*(range(len(op.shapes())) for op in plan.operators.values())))


def with_shapes(plan: Plan, combo: tuple[int, ...]) -> Plan:
    ops = {
        name: op.reshaped(op.shapes()[k]) for (name, op), k in zip(plan.operators.items(), combo)
    }
    return replace(plan, operators=ops, instances=_instances(ops))


def shapes_of(plan: Plan) -> dict[str, list]:
    return {n: [op.device, op.devices_per_replica] for n, op in plan.operators.items()}


@dataclass(frozen=True)
class Space:
    """The replica vectors a plan may take: >= 1 each, within each (cluster, device) pool, and
    with host tiers, a rung of the tiers' ladder as the last coordinate."""

    names: tuple[str, ...]
    per_device: tuple[int, ...]  # devices one replica uses
    prices: tuple[float, ...]  # $/h of one replica's devices
    pools: tuple[tuple[int, tuple[int, ...]], ...]  # (devices available, operator indices)
    # per rung: each tiered operator's host GiB per replica, and every operator's tier $/h/replica
    tier_gib: tuple[dict[str, float], ...] = ()
    tier_prices: tuple[tuple[float, ...], ...] = ()

    @property
    def rungs(self) -> int:
        return len(self.tier_gib)

    @staticmethod
    def of(plan: Plan) -> Space:
        names = tuple(plan.operators)
        ops = [plan.operators[n] for n in names]
        pools: dict[tuple[str, str], list[int]] = {}
        for i, op in enumerate(ops):
            pools.setdefault((op.cluster, op.device), []).append(i)
        tiers = tiered(plan)
        rungs = {n: ladder(plan.operators[n].host_cache.max_gib) for n in tiers}
        steps = len(rungs[tiers[0]]) if tiers else 0
        tier_gib = tuple({n: rungs[n][k] for n in tiers} for k in range(steps))
        tier_prices = tuple(
            tuple(
                gib.get(n, 0.0) * (op.host_cache.usd_per_gib_hour if op.host_cache else 0.0)
                for n, op in zip(names, ops)
            )
            for gib in tier_gib
        )
        return Space(
            names,
            tuple(op.devices_per_replica for op in ops),
            tuple(
                op.devices_per_replica * plan.device_classes[op.device].usd_per_hour for op in ops
            ),
            tuple(
                (plan.clusters[c].devices.get(d, 0), tuple(idx)) for (c, d), idx in pools.items()
            ),
            tier_gib,
            tier_prices,
        )

    def cost(self, r: Replicas) -> float:
        price = sum(n * p for n, p in zip(r, self.prices))
        if self.rungs:
            price += sum(n * p for n, p in zip(r, self.tier_prices[r[-1]]))
        return price

    def host_gib(self, r: Replicas) -> dict[str, float]:
        """The candidate's host tier per replica of each tiered operator ({}: no tier)."""
        return dict(self.tier_gib[r[-1]]) if self.rungs else {}

    def fits(self, r: Replicas) -> bool:
        n = len(self.names)
        return all(x >= 1 for x in r[:n]) and all(
            sum(r[i] * self.per_device[i] for i in idx) <= have for have, idx in self.pools
        )

    def upper(self, i: int) -> int:
        """The most replicas operator i can have (every other operator at one)."""
        for have, idx in self.pools:
            if i in idx:
                others = sum(self.per_device[j] for j in idx if j != i)
                return max(0, (have - others) // self.per_device[i])
        return 0

    def all(self, budget: float | None = None) -> list[Replicas]:
        ranges = [range(1, self.upper(i) + 1) for i in range(len(self.names))]
        if self.rungs:
            ranges.append(range(self.rungs))
        return [
            r
            for r in itertools.product(*ranges)
            if self.fits(r) and (budget is None or self.cost(r) <= budget + 1e-9)
        ]

    def maximal(self, r: Replicas, budget: float | None) -> bool:
        """No operator can take one more replica within the devices and the budget (at the same
        host-tier rung: a larger tier instead of a replica is another candidate)."""
        for i in range(len(self.names)):
            up = r[:i] + (r[i] + 1,) + r[i + 1 :]
            if self.fits(up) and (budget is None or self.cost(up) <= budget + 1e-9):
                return False
        return True
