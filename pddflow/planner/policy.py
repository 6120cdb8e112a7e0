"""The planner's policy: one pool's load and one replica's capacity in, a replica count out, with
its reason (docs/runtime.md, The planner). Pure like the scheduler's policies: the runtime's
autoscaler and the simulator's elastic fleet measure, this decides.

A pool is sized to run at `target_utilization` of what its replicas can do within the SLA:
- a prefill pool's load is the uncached prompt tokens arriving per second, plus the
  tokens queued now spread over the queue deadline (half the TTFT SLA): queue time counts;
- a decode pool's load is the sequences it holds (running and waiting: a queue counts), against
  the batch one replica steps within the TPOT SLA.

Up at once. Down only after `scale_down_after_s` of lower load and as long after the pool's last
change, and to the most any decision of the last 2 x `scale_down_after_s` needed at 0.8 x the
target (`DOWN_BAND`: room for the load's noise), so the rest hold the predicted load and counts do
not turn round with every dip."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from pddflow.graph.plan import Plan

DOWN_BAND = 0.8


@dataclass(frozen=True)
class PlannerConfig:
    target_utilization: float = 0.7  # headroom: the share of its capacity a pool is sized to use
    scale_down_after_s: float = 30.0  # a smaller count must have sufficed this long
    queue_drain_s: float = 2.5  # queued prompt tokens must be prefilled within this (TTFT SLA / 2)


@dataclass(frozen=True)
class PoolLoad:
    """One pool's measurements at one decision, for what it does: a pool that prefills has the
    prompt terms, one that decodes the sequence terms (a colocated pool both; the larger need
    wins). Prompt work is in any unit the capacity shares (`prompt_unit`: the runtime measures
    uncached tokens, the simulator its device model's seconds). Capacities are one replica's,
    None until measured. `link_utilization`: a pool whose prefix cache spares KV a link would
    carry (a main decoder with a radix cache across the WAN) gets the link's measured use: while it
    is above the target the pool does not shrink and grows by one (more cache, fewer bytes)."""

    operator: str
    prompt_work: float | None = None  # per second, arriving
    prompt_queued: float = 0.0  # waiting to be prefilled now
    prefill_capacity: float | None = None  # per second, one replica
    prompt_unit: str = "prompt tok"
    sequences: float | None = None  # held: running and waiting
    decode_capacity: float | None = None  # the batch one replica steps within the TPOT SLA
    link_utilization: float | None = None

    def parts(self, queue_drain_s: float, current: int) -> list[tuple[float, float | None, str]]:
        """(work, one replica's capacity, unit) of each thing the pool does. A queue counts
        beyond what the `current` replicas drain within `queue_drain_s` (a long prompt queued
        on one replica is not a reason to start another), to be drained within it."""
        out = []
        if self.prompt_work is not None:
            work = self.prompt_work
            if self.prefill_capacity:
                over = self.prompt_queued - current * self.prefill_capacity * queue_drain_s
                work += max(over, 0.0) / max(queue_drain_s, 1e-9)
            out.append((work, self.prefill_capacity, f"{self.prompt_unit}/s"))
        if self.sequences is not None:
            out.append((self.sequences, self.decode_capacity, "seqs"))
        return out


@dataclass(frozen=True)
class PoolDecision:
    operator: str
    at_s: float
    current: int
    target: int
    needed: int  # the count the load asks for now, within the bounds
    utilization: float | None  # the load over the current replicas' capacity
    reason: str

    @property
    def changes(self) -> bool:
        return self.target != self.current

    def as_json(self) -> dict:
        return {
            "operator": self.operator,
            "at_s": round(self.at_s, 3),
            "current": self.current,
            "target": self.target,
            "needed": self.needed,
            "utilization": None if self.utilization is None else round(self.utilization, 4),
            "reason": self.reason,
        }


@dataclass
class _PoolMemory:
    low_since: float | None = None  # needed < current since then, without a break
    floors: deque[tuple[float, int]] = field(default_factory=deque)  # (at, count at the band)
    changed_at: float = -math.inf


class Planner:
    """`bounds`: operator -> (min, max) replicas."""

    def __init__(self, config: PlannerConfig, bounds: dict[str, tuple[int, int]]):
        for op, (lo, hi) in bounds.items():
            if not 1 <= lo <= hi:
                raise ValueError(f"{op}: planner bounds {lo}..{hi} need 1 <= min <= max")
        if not 0 < config.target_utilization <= 1:
            raise ValueError("target_utilization must be in (0, 1]")
        self.config, self.bounds = config, bounds
        self._memory = {op: _PoolMemory() for op in bounds}

    @classmethod
    def for_plan(cls, plan: Plan) -> Planner:
        """The graph's `autoscale:` planner over the plan's pools (its SLA's TTFT halved is the
        queue's deadline); the caller decides every `autoscale.interval_s`."""
        a = plan.autoscale
        config = PlannerConfig(
            a.target_utilization, a.scale_down_after_s, plan.scheduler.ttft_s / 2
        )
        return cls(config, plan.pool_bounds())

    def decide(self, now: float, load: PoolLoad, current: int) -> PoolDecision:
        """The count `load.operator` should run, `current` running now."""
        lo, hi = self.bounds[load.operator]
        mem = self._memory[load.operator]
        parts = load.parts(self.config.queue_drain_s, current)
        if not parts or any(cap is None or cap <= 0 for _, cap, _ in parts):
            return PoolDecision(
                load.operator, now, current, current, current, None,
                "holds: no capacity measured yet",
            )  # fmt: skip
        target_u = self.config.target_utilization

        def count(u: float) -> int:
            return min(hi, max(lo, *(math.ceil(w / (c * u) - 1e-9) for w, c, _ in parts)))

        needed = count(target_u)
        # down is judged with room for the load's noise: fewer replicas must run below the target
        floor = count(target_u * DOWN_BAND)
        util = max(w / (max(current, 1) * c) for w, c, _ in parts)
        said = (
            "; ".join(
                f"{_fmt(w)} {unit} over {current} x {_fmt(c)} = {w / (max(current, 1) * c):.0%}"
                for w, c, unit in parts
            )
            + f" (target {self.config.target_utilization:.0%}): needs {needed}"
        )
        window = self.config.scale_down_after_s
        mem.floors.append((now, floor))
        while mem.floors[0][0] < now - 2 * window - 1e-6:  # the memory of a down
            mem.floors.popleft()
        hot = load.link_utilization is not None and (
            load.link_utilization > self.config.target_utilization
        )
        if hot:  # one more at a time: a new replica's cache fills before the next is judged
            settled = now - mem.changed_at >= window
            needed = min(hi, max(needed, current + 1 if settled else current))
            said += f"; its link at {load.link_utilization:.0%}: more cache, {needed}"
        target = current
        if needed >= current:
            mem.low_since = None
            target, why = (needed, "up") if needed > current else (current, "holds")
        else:
            if mem.low_since is None:
                mem.low_since = now
            since = max(mem.low_since, mem.changed_at)
            most = max(n for _, n in mem.floors)  # what the last stretch needed at most
            if now - since < window:
                why = f"holds: down after {window:g} s of lower load (for {now - since:.0f} s)"
            elif most >= current:
                why = f"holds: {current} run below {target_u * DOWN_BAND:.0%} only all together"
            else:
                # a pool whose cache spares a link steps down one at a time (the link is judged
                # again before the next); others go to what the lower load needed at most
                step = current - 1 if load.link_utilization is not None else most
                target, why = max(most, step), "down"
        if target != current:
            mem.changed_at, mem.low_since = now, None
        return PoolDecision(
            load.operator, now, current, target, needed, util, f"{why} {current}->{target}: {said}"
        )


def _fmt(x: float) -> str:
    return f"{x:.3g}" if x < 1000 else f"{x:,.0f}"


def direction_changes(counts: list[int]) -> int:
    """How often a count sequence turned around (up then down, or down then up)."""
    changes, last = 0, 0
    for a, b in zip(counts, counts[1:], strict=False):
        step = (b > a) - (b < a)
        if step and last and step != last:
            changes += 1
        if step:
            last = step
    return changes
