"""One rule splits load between decode pools: declared shares as given, the rest by decode
capacity; a link carries only its pools' part; the simulator reports the same rule's shares."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pddflow.graph import load_plan
from pddflow.graph.feasibility import Load, analyze
from pddflow.graph.load_split import channel_share, pool_shares

ROOT = Path(__file__).resolve().parents[2]
THREE_DC = ROOT / "graphs" / "examples" / "three_dc_two_main_pools.yaml"


def _undeclared(plan):
    return dataclasses.replace(
        plan,
        variants={n: dataclasses.replace(v, expected_share=None) for n, v in plan.variants.items()},
    )


def test_declared_shares_are_taken_as_given():
    shares = pool_shares(load_plan(str(THREE_DC)))
    assert shares["main_b"].share == pytest.approx(0.65)  # p_mdb 0.5 + p_rld_mdb 0.15
    assert shares["main_c"].share == pytest.approx(0.35)


def test_undeclared_pools_split_by_decode_capacity():
    plan = _undeclared(load_plan(str(THREE_DC)))
    # main_b: 8 replicas x 8 h20 x 4.0 TB/s = 256; main_c: 4 x 8 h200 x 4.8 = 153.6
    b, c = pool_shares(plan)["main_b"].share, pool_shares(plan)["main_c"].share
    assert b == pytest.approx(256 / 409.6) and c == pytest.approx(153.6 / 409.6)
    assert channel_share(plan, "prefill.kv->main_b.kv") == pytest.approx(b)
    assert channel_share(plan, "relay.handoff->main_c.handoff") == pytest.approx(c)
    assert channel_share(plan, "prefill.kv->relay.kv") == pytest.approx(1.0)  # both pools' relays


def test_each_link_carries_only_its_pools_part():
    plan = _undeclared(load_plan(str(THREE_DC)))
    load = Load(rps=1, prompt_tokens=100_000, output_tokens=10, hit_rate=0.0)
    links = {link.name: link for link in analyze(plan, load).links}
    kv = 100_000 * plan.model.arch.kv_bytes_per_token * 8 / 1e9  # Gbit per request
    ids = 10 * 15 * 8 / 1e9
    shares = pool_shares(plan)
    for link, pool in (("A-B", "main_b"), ("A-C", "main_c")):
        want = shares[pool].share * (kv + ids)
        assert links[link].required_gbps_without_drc == pytest.approx(want, rel=1e-3)


def test_a_single_pool_takes_everything():
    plan = load_plan(str(ROOT / "graphs" / "pdd.yaml"))
    assert pool_shares(plan)["main"].share == 1.0
    assert all(channel_share(plan, c.id) == 1.0 for c in plan.channels)


def test_simulate_reports_the_rule_beside_its_split():
    from pddflow.sim.agentic import AgenticConfig, generate
    from pddflow.sim.metrics import summarize
    from pddflow.sim.simulator import Simulation

    plan = load_plan(str(THREE_DC))
    sim = Simulation(plan, generate(AgenticConfig(requests=60)), seed=1)
    sim.run()
    pools = summarize(sim)["pools"]
    assert {p: v["plan_share"] for p, v in pools.items()} == {"main_b": 0.65, "main_c": 0.35}
    assert sum(v["requests"] for v in pools.values()) == 60
