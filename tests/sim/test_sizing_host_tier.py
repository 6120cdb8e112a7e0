"""`pddflow size` with a host-memory KV tier: the tier's ladder is one more coordinate of the
search, its price enters a candidate's cost exactly as `plan` and `simulate` compute it, and the
search buys a tier when it pays and none when it does not."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from pddflow.graph import load_plan
from pddflow.sim.host_tier import ladder, with_host_gib
from pddflow.sim.sizing.scores import Score
from pddflow.sim.sizing.search import Search, size_budget, write_graph
from pddflow.sim.sizing.space import Space, with_replicas

ROOT = Path(__file__).resolve().parents[2]

# The sizing tests' three-operator chain (conftest.py; a: $2 a replica, b: $1, c: $3; 2a + b <= 8,
# c <= 4) with a host tier under c's radix cache: 0, 100, 200 or 400 GiB per replica at $0.0025 per
# GiB-hour, so $0, $0.25, $0.5 or $1 more per c replica.


@pytest.fixture(scope="module")
def tiered(tmp_path_factory, three_chain_yaml):
    f = tmp_path_factory.mktemp("g") / "three_tiered.yaml"
    f.write_text(
        three_chain_yaml.replace("name: three\n", "name: three_tiered\n").replace(
            "c: {op: main_decode, cluster: B, device: gb, replicas: 1}",
            "c: {op: main_decode, cluster: B, device: gb, replicas: 1,\n"
            "      host_cache: {gib: 0, max_gib: 400, usd_per_gib_hour: 0.0025}}",
        )
    )
    return f, load_plan(str(f))


def _analytic(plan, c_rates):
    """Goodput = the slowest stage: a 4 req/s a replica, b 6, c `c_rates[rung]` (what the tier's
    hits are worth to c at each rung)."""
    sp = Space.of(plan)

    def score(r) -> Score:
        g = min(4.0 * r[0], 6.0 * r[1], c_rates[r[3]] * r[2])
        return Score(
            dict(zip(sp.names, r)), sp.cost(r), g, g, 1.0, 0.0, 0.0, 0.0, host_gib=sp.host_gib(r)
        )

    return score


def test_the_ladder_is_a_coordinate_and_its_price_is_the_plans(tiered):
    _, plan = tiered
    assert ladder(400) == (0.0, 100.0, 200.0, 400.0) and ladder(0) == (0.0,)
    sp = Space.of(plan)
    assert sp.rungs == 4
    for r in itertools.product(range(1, 4), range(1, 3), range(1, 5), range(4)):
        p = with_host_gib(with_replicas(plan, dict(zip(sp.names, r))), sp.host_gib(r))
        # the search's price of a candidate is what plan/simulate charge for it, to the cent
        assert sp.cost(r) == pytest.approx(p.cost_per_hour(), abs=1e-9)
    # two c replicas with 400 GiB each at $0.0025: $2 on top of 2a + b + 3c
    assert sp.cost((1, 1, 2, 3)) == pytest.approx(2 + 1 + 6 + 2.0)


# By hand, budget $14 (goodput g = min(4a, 6b, rate_c x c); cost 2a + b + (3 + tier) c):
#  a tier that pays (c: 3, 4, 4.5, 5 req/s a replica at 0, 100, 200, 400 GiB): no tier gives
#  g = 6 at best (g = 8 needs c = 3: $15); 100 GiB gives g = 8 at (2, 2, 2) for 4 + 2 + 6.5 =
#  $12.5; 200 and 400 GiB also reach only 8 (g = 9 needs a = 3: $15), at $13 and $14.
#  a tier that does not pay (c: 3 at every size): (2, 1, 2) with no tier, g = 6 at $11.
@pytest.mark.parametrize("exhaustive_max", [500, 0])  # every maximal candidate; pattern search
def test_buys_a_tier_when_it_pays(tiered, exhaustive_max):
    _, plan = tiered
    search = Search(plan, None, evaluator=_analytic(plan, (3.0, 4.0, 4.5, 5.0)))
    res = size_budget(search, 14.0, 1.0, exhaustive_max=exhaustive_max)
    assert res.best.replicas == {"a": 2, "b": 2, "c": 2}
    assert res.best.host_gib == {"c": 100.0}
    assert (res.best.slo_goodput_rps, res.best.cost_per_hour) == (8.0, 12.5)


@pytest.mark.parametrize("exhaustive_max", [500, 0])
def test_buys_no_tier_when_it_does_not_pay(tiered, exhaustive_max):
    _, plan = tiered
    search = Search(plan, None, evaluator=_analytic(plan, (3.0, 3.0, 3.0, 3.0)))
    res = size_budget(search, 14.0, 1.0, exhaustive_max=exhaustive_max)
    assert res.best.replicas == {"a": 2, "b": 1, "c": 2}
    assert res.best.host_gib == {"c": 0.0}
    assert (res.best.slo_goodput_rps, res.best.cost_per_hour) == (6.0, 11.0)


def test_the_winner_is_written_with_its_tier(tiered, tmp_path):
    f, plan = tiered
    best = Score({"a": 2, "b": 2, "c": 2}, 12.5, 8.0, 8.0, 1.0, 0.0, 0.0, 0.0)
    best.host_gib = {"c": 100.0}
    out = write_graph(str(f), best, tmp_path / "w.yaml", "note")
    p = load_plan(str(out))
    assert p.operators["c"].host_cache.gib == 100.0
    assert p.operators["c"].host_cache.max_gib == 400.0
    assert p.cost_per_hour() == pytest.approx(12.5)
