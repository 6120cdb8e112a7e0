"""The planner's policy (pddflow/planner/policy.py): up at once, down only after a stretch of lower
load and with room below the target, the queue counted beyond what the replicas drain, a pool whose
cache spares a hot link grown one at a time, and its reasons in numbers."""

from __future__ import annotations

import random

import pytest

from pddflow.planner import Planner, PlannerConfig, PoolLoad, direction_changes

CFG = PlannerConfig(target_utilization=0.7, scale_down_after_s=30, queue_drain_s=2.5)


def decode(seqs: float, capacity: float = 10, link: float | None = None) -> PoolLoad:
    return PoolLoad("main", sequences=seqs, decode_capacity=capacity, link_utilization=link)


def run(planner: Planner, loads, current: int, start: float = 0.0, step: float = 5.0):
    """Apply each decision; the counts after each."""
    counts = []
    for k, load in enumerate(loads):
        d = planner.decide(start + k * step, load, current)
        current = d.target
        counts.append(current)
    return counts


def test_up_at_once_to_what_the_load_needs_with_its_reason():
    p = Planner(CFG, {"main": (1, 8)})
    d = p.decide(0.0, decode(20), 1)  # 20 seqs / (10 x 0.7) -> 3
    assert (d.current, d.target, d.needed) == (1, 3, 3)
    assert d.reason.startswith("up 1->3")
    assert "20 seqs over 1 x 10 = 200%" in d.reason and "needs 3" in d.reason
    assert d.utilization == pytest.approx(2.0)


def test_down_waits_for_a_stretch_of_lower_load_then_takes_its_most():
    p = Planner(CFG, {"main": (1, 8)})
    assert p.decide(0.0, decode(40), 1).target == 6
    # lower load: nothing for 30 s of it, nor while the last 60 s held a decision that needed
    # 6 or more (the rise itself, at t = 0); then to what those 60 s needed most, with room below
    # the target (0.7 x 0.8)
    counts = run(p, [decode(8)] * 3 + [decode(15)] + [decode(8)] * 12, 6, start=5.0)
    assert counts[:12] == [6] * 12  # t = 5 .. 60
    assert counts[12:] == [3] * 4  # 15 seqs / (10 x 0.56) -> 3, from t = 65
    assert direction_changes([1, 6, *counts]) == 1


def test_the_bounds_hold_and_are_checked():
    p = Planner(CFG, {"main": (2, 4)})
    assert p.decide(0.0, decode(1000), 2).target == 4
    assert run(p, [decode(0)] * 20, 4, start=5.0)[-1] == 2
    with pytest.raises(ValueError, match="1 <= min <= max"):
        Planner(CFG, {"main": (3, 2)})
    with pytest.raises(ValueError, match="target_utilization"):
        Planner(PlannerConfig(target_utilization=1.5), {"main": (1, 2)})


def test_nothing_measured_yet_holds():
    d = Planner(CFG, {"main": (1, 4)}).decide(0.0, decode(50, capacity=None), 2)
    assert (d.target, d.reason) == (2, "holds: no capacity measured yet")


def test_noisy_load_does_not_flap():
    """A load that wanders +-30% around 3 replicas' worth: at most one turn in 10 minutes."""
    rng = random.Random(0)
    p = Planner(CFG, {"main": (1, 8)})
    loads = [decode(21 * rng.uniform(0.7, 1.3)) for _ in range(120)]
    counts = run(p, loads, 3)
    assert direction_changes([3, *counts]) <= 1
    assert max(counts) <= 5


def test_prefill_queue_counts_beyond_what_the_replicas_drain():
    p = Planner(CFG, {"prefill": (1, 8)})

    def prefill(rate: float, queued: float) -> PoolLoad:
        return PoolLoad("prefill", prompt_work=rate, prompt_queued=queued, prefill_capacity=1000)

    # 2 replicas drain 2 x 1000 x 2.5 = 5000 queued tokens within the deadline: no more needed
    assert p.decide(0.0, prefill(1000, 5000), 2).target == 2
    # 10,000 queued: 5000 beyond, over 2.5 s = 2000 tok/s more -> (1000 + 2000) / 700 -> 5
    d = p.decide(5.0, prefill(1000, 10_000), 2)
    assert d.target == 5 and "prompt tok/s" in d.reason


def test_a_colocated_pool_takes_the_larger_need():
    p = Planner(CFG, {"both": (1, 8)})
    load = PoolLoad(
        "both", prompt_work=700, prefill_capacity=1000, sequences=40, decode_capacity=10
    )
    assert p.decide(0.0, load, 1).target == 6  # decode: 40 / 7 -> 6 beats prefill's 1


def test_a_hot_link_grows_a_cached_pool_one_at_a_time_and_blocks_its_shrinking():
    p = Planner(CFG, {"main": (1, 6)})
    counts = run(p, [decode(1, link=0.9)] * 14, 1)  # 70 s, one more per 30 s
    assert counts[0] == 2 and counts[-1] == 4 and counts == sorted(counts)
    assert "its link at 90%" in p.decide(70.0, decode(1, link=0.9), 4).reason
    # the link cools: one step down per stretch, not straight to what the sequences need
    cool = run(p, [decode(1, link=0.3)] * 8, 4, start=75.0)
    assert cool[-1] == 3 and min(cool) == 3


def test_direction_changes_counts_turns():
    assert direction_changes([1, 2, 3, 3, 2, 1, 2]) == 2
    assert direction_changes([3, 3, 3]) == 0
    assert direction_changes([1, 4, 4, 1]) == 1
