"""The host-memory KV tier (graph: `operators.X.host_cache`): evicted blocks move there instead of
vanishing, a hit on them is loaded back at the declared bandwidth before the request's work can
start, the mirror holds both tiers, and the tier is priced wherever cost is computed."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from pddflow.graph import load_plan
from pddflow.graph.plan import HostCachePlan
from pddflow.scheduler import CacheMirror
from pddflow.sim.host_tier import HostTier
from pddflow.sim.kvstore import KVStore
from pddflow.sim.simulator import Simulation
from pddflow.sim.workload import SimRequest, Workload

ROOT = Path(__file__).resolve().parents[2]
BT = 16  # tokens per block in these workloads


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _serve(store: KVStore, prompt: tuple[int, ...]) -> int:
    """One request's prefill on `store`: its hit in blocks."""
    hold = store.acquire(prompt, 0)
    store.commit(hold, prompt)
    store.release(hold)
    return hold.hit


def test_evicted_blocks_come_back_from_the_host_tier_at_its_bandwidth():
    clock = _Clock()
    mirror = CacheMirror("p/0")
    host = HostTier(4, s_per_block=0.25, clock=clock)
    store = KVStore("p/0", 5, True, mirror, strict=True, host=host)
    a, b = (1, 2, 3, 4), (11, 12, 13, 14, 15)
    assert _serve(store, a) == 0
    assert _serve(store, b) == 0  # 5 blocks: all four of a's go to the host tier
    assert len(store.cache) == 5 and list(host.blocks) == [4, 3, 2, 1]  # evicted leaf first
    assert len(mirror) == 9  # the router still sees a's blocks
    clock.now = 10.0
    hold = store.acquire(a + (5,), 0)  # a again, one block longer
    # a's four are a hit, swapped into HBM (four of b's go down); one block is computed
    assert (hold.hit, hold.loaded, hold.missing) == (4, 4, 1)
    assert hold.ready_at == pytest.approx(10.0 + 4 * 0.25)
    assert store.cache.match_len(a) == 4 and not any(h in host for h in a)
    # a second request for the same prefix while it loads waits for the same load
    twin = store.pin(a)
    assert twin.loaded == 0 and twin.ready_at == pytest.approx(11.0)
    # HBM is full of locked and reserved blocks: nothing more can come up now
    assert store.pin((11, 12)).loaded == 0
    store.release(hold)
    store.release(twin)
    # another load queues behind the first on the link: concurrent loads share its bandwidth
    other = store.pin((11, 12))
    assert other.loaded == 2 and other.ready_at == pytest.approx(11.0 + 2 * 0.25)
    store.release(other)
    store.check_mirror()
    assert host.loaded_blocks == 6 and host.load_s == pytest.approx(1.5)


def test_without_a_tier_the_same_requests_miss():
    store = KVStore("p/0", 5, True, CacheMirror("p/0"), strict=True)
    _serve(store, (1, 2, 3, 4))
    _serve(store, (11, 12, 13, 14, 15))
    assert _serve(store, (1, 2, 3, 4, 5)) == 0


def _prompts(seed: int, n: int) -> list[tuple[int, ...]]:
    """Sessions that grow by a few blocks and come back after others ran (the host tier's case);
    a session past 30 blocks starts over (compaction)."""
    rng = random.Random(seed)
    nid = iter(range(1, 10**9))
    sessions = [(next(nid),) for _ in range(12)]
    out = []
    for _ in range(n):
        s = rng.randrange(len(sessions))
        if len(sessions[s]) > 30:
            sessions[s] = (next(nid),)
        sessions[s] = sessions[s] + tuple(next(nid) for _ in range(rng.randint(1, 4)))
        out.append(sessions[s])
    return out


def _replay(store: KVStore, clock: _Clock, seed: int) -> int:
    """300 prompts of `_prompts(seed)`, one a second; the blocks hit. The store ends exact and
    holding nothing."""
    total = 0
    for t, prompt in enumerate(_prompts(seed, 300)):
        clock.now = float(t)
        total += _serve(store, prompt)
    store.check_mirror()
    assert store.locked_or_reserved() == 0
    return total


@pytest.mark.parametrize("seed", range(3))
def test_more_host_capacity_never_lowers_the_hit_and_the_mirror_stays_exact(seed):
    hits = []
    for cap in (0, 8, 16, 32, 64, 128, 256):
        clock = _Clock()
        host = HostTier(cap, 0.001, clock) if cap else None
        store = KVStore("d/0", 40, True, CacheMirror("d/0"), strict=True, host=host)
        hits.append(_replay(store, clock, seed))
    assert hits == sorted(hits), hits
    assert hits[-1] > hits[0]  # the tier turned misses into hits


def _tiered_same_dc(gib: float, gbytes_per_s: float = 1.0, hbm_blocks: int = 5):
    """same_dc_pd on one prefill whose HBM holds `hbm_blocks` blocks, with a host tier of `gib`."""
    plan = load_plan(str(ROOT / "graphs" / "same_dc_pd.yaml")).scaled_to_local()
    kvb = plan.model.arch.kv_bytes_per_token
    tier = HostCachePlan(gib, max(gib, 1.0), 0.01, gbytes_per_s)
    p = replace(plan.operators["prefill"], kv_budget_bytes=hbm_blocks * BT * kvb, host_cache=tier)
    return replace(plan, operators={**plan.operators, "prefill": p}), BT * kvb


def _three_requests() -> Workload:
    """a, then b (evicts a from a 5-block HBM), then a + one block, each alone on the cluster."""
    reqs = [
        SimRequest(0, 0.0, 4 * BT, 8, (1, 2, 3, 4)),
        SimRequest(1, 20.0, 5 * BT, 8, (11, 12, 13, 14, 15)),
        SimRequest(2, 40.0, 5 * BT, 8, (1, 2, 3, 4, 5)),
    ]
    return Workload("three", reqs, block_tokens=BT)


def test_the_load_delays_the_prefill_by_blocks_times_block_bytes_over_bandwidth():
    plan, block_bytes = _tiered_same_dc(gib=1.0, gbytes_per_s=0.5)
    sim = Simulation(plan, _three_requests(), strict_mirrors=True)
    flights = {r.req.rid: r for r in sim.run()}
    assert all(r.done and not r.failed for r in flights.values())
    third = flights[2]
    assert third.prefill.hit_tokens == 4 * BT  # a's blocks came back from host memory
    load_s = 4 * block_bytes / 0.5e9  # 4 blocks over 0.5 GB/s
    assert third.prefill_started_at == pytest.approx(40.0 + load_s, abs=1e-9)
    # the same workload without a tier: a miss, started on arrival
    cold, _ = _tiered_same_dc(gib=0.0)
    runs0 = {r.req.rid: r for r in Simulation(cold, _three_requests()).run()}
    assert runs0[2].prefill.hit_tokens == 0
    assert runs0[2].prefill_started_at == pytest.approx(40.0, abs=1e-9)


def test_the_tier_is_priced_in_plan_and_simulate_cost():
    plan, _ = _tiered_same_dc(gib=64.0)
    base, _ = _tiered_same_dc(gib=0.0)
    from pddflow.graph.plan import Plan

    assert Plan.from_json(plan.to_json()) == plan  # the tier survives the plan's JSON
    # one prefill replica x 64 GiB x $0.01 per GiB-hour
    assert plan.host_cache_cost_per_hour() == pytest.approx(0.64)
    assert plan.cost_per_hour() - base.cost_per_hour() == pytest.approx(0.64)
    from pddflow.sim.metrics import summarize

    sim = Simulation(plan, _three_requests())
    sim.run()
    m = summarize(sim)
    assert m["cost_per_hour"] == pytest.approx(round(plan.cost_per_hour(), 3))
    assert m["host_tiers"]["prefill"]["usd_per_hour"] == pytest.approx(0.64)
    assert m["host_tiers"]["prefill"]["loaded_blocks"] == 4  # the third request's a
    sim0 = Simulation(base, _three_requests())
    sim0.run()
    assert "host_tiers" not in summarize(sim0)  # none bought: the report is as it was


def test_the_decoders_host_blocks_load_when_its_kv_lands_and_delay_its_decode():
    """Main's prefix in host memory is pinned there at arrival (not sent, no HBM held), and
    loaded once the KV has landed and room is reserved: the decode starts that load later."""
    plan = load_plan(str(ROOT / "graphs" / "same_dc_pd.yaml")).scaled_to_local()
    kvb = plan.model.arch.kv_bytes_per_token
    slow = HostCachePlan(1.0, 1.0, 0.01, 0.001)  # 1 MB/s
    d = replace(plan.operators["decode"], kv_budget_bytes=6 * BT * kvb, host_cache=slow)
    plan = replace(plan, operators={**plan.operators, "decode": d})
    sim = Simulation(plan, _three_requests(), strict_mirrors=True)
    flights = {r.req.rid: r for r in sim.run()}
    third = flights[2]
    assert third.main.hit_blocks == 4  # a's four blocks did not travel again
    landed = third.main.sent_at + third.main.transfer_s
    load_s = 4 * BT * kvb / 1e6
    assert third.first_token_at >= landed + load_s
    assert sim.stores["decode/0"].host.load_s == pytest.approx(load_s)
    # without the load the decode would have started within a step of landing
    assert third.first_token_at - (landed + load_s) < 0.5


def test_a_tiered_agentic_run_keeps_strict_mirrors_and_gains_hits():
    """Both caches tiered and short of HBM, the mirrors compared with HBM + tier after every event:
    the run ends clean, and the tier turns prefill misses into hits."""
    from pddflow.sim.agentic import AgenticConfig, generate

    plan = load_plan(str(ROOT / "graphs" / "same_dc_pd.yaml")).scaled_to_local()
    wl = generate(AgenticConfig(requests=200, rps=4.0, first_prompt_tokens=3000, seed=1))
    kvb = plan.model.arch.kv_bytes_per_token * wl.block_tokens
    hits = []
    for gib in (0.0, 64.0):
        tier = HostCachePlan(gib, 64.0, 0.01, 25.0)
        ops = {
            n: replace(op, kv_budget_bytes=60 * kvb, host_cache=tier)
            for n, op in plan.operators.items()
        }
        sim = Simulation(replace(plan, operators=ops), wl, strict_mirrors=True)
        flights = sim.run()  # raises on mirror drift or leaked blocks
        assert all(r.done and not r.failed for r in flights)
        hits.append(sum(r.prefill.hit_tokens for r in flights))
        if gib:
            assert sim.stores["prefill/0"].host.loaded_blocks > 0
    assert hits[1] > hits[0]


def test_plan_shows_and_prices_the_tier(tmp_path):
    import json

    from typer.testing import CliRunner

    from pddflow.cli import app

    text = (ROOT / "graphs" / "sim" / "same_dc_pd_88_host.yaml").read_text()
    g = tmp_path / "bought.yaml"
    g.write_text(text.replace("host_cache: {gib: 0,", "host_cache: {gib: 256,"))
    res = CliRunner().invoke(app, ["plan", str(g), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    rows = {r["operator"]: r for r in d["placement"]}
    # 10 prefill and 12 decode replicas x 256 GiB x $0.005: $12.80 and $15.36 on top of $176
    assert rows["prefill"]["host_cache_usd_per_hour"] == pytest.approx(12.8)
    assert rows["decode"]["host_cache_usd_per_hour"] == pytest.approx(15.36)
    assert rows["decode"]["usd_per_hour"] == pytest.approx(96 + 15.36)
    assert d["cost_per_hour"] == pytest.approx(176 + 12.8 + 15.36)
    text_out = CliRunner().invoke(app, ["plan", str(g)]).output
    assert "host-memory KV tiers" in text_out


def test_pdd_trace_slice_with_a_tiered_main_never_drifts():
    """test_simulate's tight-cache trace slice on pdd.yaml with a host tier under main's DRC: every
    move between the tiers keeps the mirror exact, the run ends clean, and main loads from it."""
    from pddflow.data import MOONCAKE_TRACE as trace
    from pddflow.sim.trace import load_trace

    p = load_plan(str(ROOT / "graphs" / "pdd.yaml"))
    main = p.operators["main"]
    ops = {
        **p.operators,
        "main": replace(
            main,
            kv_budget_bytes=main.kv_budget_bytes / 4,
            host_cache=HostCachePlan(64.0, 64.0, 0.005, 25.0),
        ),
    }
    sim = Simulation(
        replace(p, operators=ops), load_trace(trace, limit=400), seed=3, strict_mirrors=True
    )
    sim.run()
    assert all(r.done for r in sim.flights)
    assert sum(st.host.loaded_blocks for st in sim.stores.values() if st.host) > 0
