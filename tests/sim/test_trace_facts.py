"""Before anything else is trusted: replaying the shipped Mooncake trace with an unbounded cache
reproduces its documented cache facts (pddflow/data/README.md)."""

from __future__ import annotations

import statistics

import pytest

from pddflow.data import MOONCAKE_TRACE
from pddflow.sim.trace import load_trace


def test_mooncake_trace_cache_facts():
    wl = load_trace(MOONCAKE_TRACE)
    assert len(wl.requests) == 12031
    assert wl.duration_s == pytest.approx(3537, abs=1)
    assert all(r.hashes[0] == 0 for r in wl.requests)
    hits = wl.unbounded_hit_rates()
    assert statistics.mean(hits) == pytest.approx(0.38, abs=0.005)
    assert statistics.median(hits) == pytest.approx(0.33, abs=0.005)
    assert sum(h < 0.10 for h in hits) / len(hits) == pytest.approx(0.32, abs=0.005)
    assert sum(h >= 0.90 for h in hits) / len(hits) == pytest.approx(0.13, abs=0.005)


def test_scaling_keeps_the_cache_structure():
    base = load_trace(MOONCAKE_TRACE, limit=500)
    scaled = load_trace(
        MOONCAKE_TRACE, limit=500, rate_scale=2.0, input_scale=0.5, output_scale=2.0
    )
    assert scaled.duration_s == pytest.approx(base.duration_s / 2)
    assert scaled.block_tokens == 256
    assert [r.hashes for r in scaled.requests] == [r.hashes for r in base.requests]
    assert scaled.unbounded_hit_rates() == base.unbounded_hit_rates()
    assert scaled.requests[7].output_tokens == 2 * base.requests[7].output_tokens
