"""`pddflow size` (pddflow/sim/sizing/): the search finds a hand-computed optimum, more budget
never gives less goodput, the simulator-backed search is deterministic and cached, and the PDD
workload preset matches PDD's published conditions."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pddflow.cli import app
from pddflow.graph import load_plan
from pddflow.sim.agentic import AgenticConfig, generate, pdd_conditions
from pddflow.sim.metrics import summarize
from pddflow.sim.simulator import Simulation
from pddflow.sim.sizing.cache import Cache
from pddflow.sim.sizing.scores import Score
from pddflow.sim.sizing.search import Search, size, size_budget, size_target, write_graph
from pddflow.sim.sizing.space import Space, with_replicas
from pddflow.sim.sizing.workloads import AgenticSource

ROOT = Path(__file__).resolve().parents[2]

RATES = (4.0, 6.0, 3.0)  # req/s a replica of a, b and c (the chain: conftest.py)


@pytest.fixture(scope="module")
def three(tmp_path_factory, three_chain_yaml) -> object:
    f = tmp_path_factory.mktemp("g") / "three.yaml"
    f.write_text(three_chain_yaml)
    return load_plan(str(f))


def _analytic(plan, rates=RATES):
    sp = Space.of(plan)

    def score(r) -> Score:
        g = min(n * k for n, k in zip(r, rates))
        return Score(dict(zip(sp.names, r)), sp.cost(r), g, g, 1.0, 0.0, 0.0, 0.0)

    return score


# By hand (goodput g = min(4a, 6b, 3c); cost 2a + b + 3c; 2a + b <= 8, c <= 4):
#  $10: g = 4 needs a >= 1, b >= 1, c >= 2 ($9); g = 6 needs a, c >= 2 ($11): (1, 1, 2) at $9.
#  $14: g = 6 at (2, 1, 2), $11; g = 8 needs a >= 2, b >= 2, c >= 3 ($15).
#  $20 and $30: c <= 4 caps g at 12, which needs a >= 3, b >= 2, c = 4: (3, 2, 4) at $20.
HAND = {10: ((1, 1, 2), 4.0, 9.0), 14: ((2, 1, 2), 6.0, 11.0), 20: ((3, 2, 4), 12.0, 20.0)}
HAND[30] = HAND[20]


@pytest.mark.parametrize("exhaustive_max", [24, 0])  # every maximal candidate; pattern search
@pytest.mark.parametrize("budget", sorted(HAND))
def test_finds_the_optimum_computed_by_hand(three, budget, exhaustive_max):
    search = Search(three, None, evaluator=_analytic(three))
    res = size_budget(search, budget, 1.0, exhaustive_max=exhaustive_max)
    replicas, goodput, cost = HAND[budget]
    assert tuple(res.best.replicas.values()) == replicas
    assert (res.best.slo_goodput_rps, res.best.cost_per_hour) == (goodput, cost)
    # and brute force agrees with the hand
    sp = Space.of(three)
    top = max(min(n * k for n, k in zip(r, RATES)) for r in sp.all(budget))
    assert top == goodput
    front = res.frontier()
    assert [s.cost_per_hour for s in front] == sorted(s.cost_per_hour for s in front)
    assert all(x.slo_goodput_rps < y.slo_goodput_rps for x, y in itertools.pairwise(front))


@pytest.mark.parametrize("exhaustive_max", [24, 0])
def test_more_budget_never_gives_lower_goodput(three, exhaustive_max):
    best = []
    for budget in range(6, 36):
        search = Search(three, None, evaluator=_analytic(three))
        res = size_budget(search, float(budget), 1.0, exhaustive_max=exhaustive_max)
        best.append(res.best.slo_goodput_rps if res.best else 0.0)
    assert best == sorted(best)
    assert best[-1] == 12.0


def test_no_winner_when_nothing_meets_the_sla(three):
    """A graph whose SLA no candidate meets at any rate has no winner (not its cheapest zero)."""

    def never(r) -> Score:
        sp = Space.of(three)
        return Score(dict(zip(sp.names, r)), sp.cost(r), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False)

    assert size_budget(Search(three, None, evaluator=never), 20.0, 1.0).best is None


def test_target_is_met_cheapest(three):
    for target, want in ((6.0, (2, 1, 2)), (12.0, (3, 2, 4)), (13.0, None)):
        score = _analytic(three)

        def meets(r, score=score, target=target) -> Score:
            s = score(r)
            s.meets = s.slo_goodput_rps >= target
            return s

        res = size_target(Search(three, None, evaluator=meets), target)
        got = tuple(res.best.replicas.values()) if res.best else None
        assert got == want


def test_space_respects_device_pools(three):
    sp = Space.of(three)
    assert sp.upper(0) == 3 and sp.upper(1) == 6 and sp.upper(2) == 4
    assert all(2 * a + b <= 8 and c <= 4 for a, b, c in sp.all())
    assert with_replicas(three, {"a": 3}).cost_per_hour() == pytest.approx(6 + 1 + 3)


# c may also run on two devices a replica ($6), serving 7 req/s: the search compares both shapes.
def _analytic_shaped(plan):
    """As `_analytic`, c's rate a replica by its shape: 3 on one device, 7 on two."""
    return _analytic(plan, (*RATES[:2], {1: 3.0, 2: 7.0}[plan.operators["c"].devices_per_replica]))


def _brute_shaped(budget: float) -> float:
    """The best goodput over both shapes of c, every replica vector within budget and pools."""
    best = 0.0
    for k, price, rate in ((1, 3.0, 3.0), (2, 6.0, 7.0)):
        for a, b, c in itertools.product(range(1, 5), range(1, 7), range(1, 5)):
            if 2 * a + b <= 8 and c * k <= 4 and 2 * a + b + price * c <= budget:
                best = max(best, min(4 * a, 6 * b, rate * c))
    return best


# By hand, $14: one device for c gives 6 at $11 (above); two give 7 with a, b >= 2 and c = 1:
# $4 + $2 + $6 = $12. $20: 12 either way at $20 (3, 2, 4 on one device; 3, 2, 2 on two).
@pytest.fixture(scope="module")
def shaped(tmp_path_factory, three_chain_yaml):
    f = tmp_path_factory.mktemp("g") / "shaped.yaml"
    f.write_text(
        three_chain_yaml.replace(
            "c: {op: main_decode, cluster: B, device: gb, replicas: 1}",
            "c: {op: main_decode, cluster: B, device: gb, replicas: 1,\n"
            "      choices: [{devices_per_replica: 2}]}",
        )
    )
    return load_plan(str(f))


def test_shapes_are_searched_and_the_best_wins(shaped, tmp_path):
    def search(p):
        return Search(p, None, evaluator=_analytic_shaped(p))

    res = size(shaped, search, budget=14.0, start_rps=1.0)
    assert res.best.replicas == {"a": 2, "b": 2, "c": 1}
    assert res.best.shapes["c"] == ["gb", 2]
    assert (res.best.slo_goodput_rps, res.best.cost_per_hour) == (7.0, 12.0)
    assert {tuple(s.shapes["c"]) for s in res.evaluated} == {("gb", 1), ("gb", 2)}
    # the winner's graph file has its shape and compiles to it
    out = write_graph(shaped.source, res.best, tmp_path / "w.yaml", "test")
    won = load_plan(str(out)).operators["c"]
    assert (won.replicas, won.devices_per_replica) == (1, 2)
    # target mode: the cheapest over both shapes
    for target, want in ((7.0, ({"a": 2, "b": 2, "c": 1}, ["gb", 2])), (6.0, None)):

        def meets(p, target=target):
            score = _analytic_shaped(p)

            def f(r):
                s = score(r)
                s.meets = s.slo_goodput_rps >= target
                return s

            return Search(p, None, evaluator=f)

        got = size(shaped, meets, target_rps=target).best
        if want is None:  # 6 req/s: one device for c, (2, 1, 2) at $11, beats $12
            assert (got.replicas, got.shapes["c"]) == ({"a": 2, "b": 1, "c": 2}, ["gb", 1])
        else:
            assert (got.replicas, got.shapes["c"]) == want


@pytest.mark.parametrize("exhaustive_max", [24, 0])
def test_shaped_search_matches_brute_force_and_is_monotone(shaped, exhaustive_max):
    best = []
    for budget in range(6, 36):
        res = size(
            shaped,
            lambda p: Search(p, None, evaluator=_analytic_shaped(p)),
            budget=float(budget),
            exhaustive_max=exhaustive_max,
        )
        got = res.best.slo_goodput_rps if res.best else 0.0
        assert got == _brute_shaped(budget), budget
        best.append(got)
    assert best == sorted(best)


# ---- with the simulator --------------------------------------------------------------------
SMALL = """
pddflow: 1
name: small_pd
model:
  weights: builtin:tiny-llama
  arch: {kv_bytes_per_token: 4096, flops_per_token: 2.0e10, weight_bytes: 10000000000}
  max_context: 16384
device_classes:
  g: {tflops: 200, hbm_gib: 40, hbm_tbps: 1, net_gbps: 100, usd_per_hour: 1.0}
clusters:
  A: {devices: {g: 4}}
operators:
  prefill: {op: prefill, cluster: A, device: g, replicas: 1}
  decode: {op: decode, cluster: A, device: g, replicas: 3, params: {max_batch: 16}}
edges:
  - {from: prefill.kv, to: decode.kv, channel: rdma_tensor}
variants:
  p_d: {path: [prefill, decode]}
scheduler:
  policy: first_variant
  sla: {ttft_s: 2, tpot_ms: 60}
"""
SMALL_LOAD = AgenticConfig(
    requests=120, rps=2.0, first_prompt_tokens=2000, output_tokens=60, think_s=5.0, seed=3
)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    f = tmp_path_factory.mktemp("s") / "small_pd.yaml"
    f.write_text(SMALL)
    return f


def test_simulated_search_is_deterministic_cached_and_monotone(small, tmp_path):
    plan = load_plan(str(small))
    src = AgenticSource(SMALL_LOAD)
    cache = Cache(tmp_path / "c.json")
    one = size_budget(Search(plan, src, seed=3, cache=cache, precision=0.1), 4.0, 2.0)
    assert one.best is not None and one.best.slo_goodput_rps > 0
    assert one.sims > 0
    # a second run reads every score from the cache: no replay
    again = size_budget(
        Search(plan, src, seed=3, cache=Cache(tmp_path / "c.json"), precision=0.1), 4.0, 2.0
    )
    assert again.sims == one.sims and again.cache_hits >= len(one.evaluated)
    assert again.best.to_dict() == one.best.to_dict()
    # two worker processes, no cache: the same answer
    par = size_budget(Search(plan, src, seed=3, jobs=2, precision=0.1), 4.0, 2.0)
    assert par.best.to_dict() == one.best.to_dict()
    # less budget: the only candidate is one replica each; never more goodput than with $4
    low = size_budget(Search(plan, src, seed=3, precision=0.1), 2.0, 2.0)
    assert low.best.replicas == {"prefill": 1, "decode": 1}
    assert low.best.slo_goodput_rps <= one.best.slo_goodput_rps


def test_size_replays_the_declared_stream_rate(tmp_path):
    """A target-mode score is one replay at the rate: the simulator's own result for the plan,
    declared stream rate included."""
    text = (ROOT / "graphs" / "sim" / "pdd_88.yaml").read_text()
    cfg = pdd_conditions(requests=80, rps=2.0, first_prompt_tokens=20000, seed=2)
    got = {}
    for gbps in (1.0, 5.0):
        f = tmp_path / f"g{gbps}.yaml"
        f.write_text(text.replace("stream_gbps: 2.5,", f"stream_gbps: {gbps},"))
        plan = load_plan(str(f))
        search = Search(plan, AgenticSource(cfg), seed=2)
        (score,) = search.run([(2, 1, 2)], "target", 2.0)
        sim = Simulation(
            with_replicas(plan, {"prefill": 2, "relay": 1, "main": 2}), generate(cfg), seed=2
        )
        sim.run()
        m = summarize(sim)
        assert (score.ttft_p90_s, score.ttft_p99_s) == (m["ttft_s"]["p90"], m["ttft_s"]["p99"])
        got[gbps] = score.ttft_p99_s
    assert got[1.0] != got[5.0]


def test_size_cli_writes_the_winner(small, tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        [
            "size",
            str(small),
            "--budget-usd-per-hour",
            "4",
            "--workload",
            "agentic",
            "-n",
            "100",
            "--precision",
            "0.2",
            "--start-rps",
            "2",
            "--jobs",
            "1",
            "--out",
            str(out),
            "--no-cache",
            "--json",
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    (g,) = d["graphs"]
    written = load_plan(g["written"])
    best = g["best"]["replicas"]
    assert {n: o.replicas for n, o in written.operators.items()} == best
    assert written.cost_per_hour() == g["best"]["cost_per_hour"] <= 4
    assert g["frontier"] and g["evaluated"] >= 1


def test_pdd_preset_matches_the_published_conditions():
    wl = generate(pdd_conditions(requests=1500, rps=4.0))
    hits = wl.unbounded_hit_rates()
    mean = sum(hits) / len(hits)
    above = sum(h > 0.95 for h in hits) / len(hits)
    prompts = [r.prompt_tokens for r in wl.requests]
    outputs = sorted(r.output_tokens for r in wl.requests)
    assert 0.87 <= mean <= 0.93
    assert 0.68 <= above <= 0.85
    assert max(prompts) <= 65536 and sum(prompts) / len(prompts) > 30000
    assert 800 <= outputs[len(outputs) // 2] <= 1300
    assert wl.meta["turns_mean_used"] >= 20
