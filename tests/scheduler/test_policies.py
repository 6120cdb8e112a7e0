"""Policy decisions on crafted states: every shipped plan shape, each rule of each policy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pddflow.core.registry import UnknownName
from pddflow.graph import load_plan
from pddflow.scheduler import (
    InstanceLoad,
    LinkEstimate,
    RequestFeatures,
    SchedulerState,
    make_policy,
)
from pddflow.scheduler.first_variant import FirstVariantPolicy
from pddflow.scheduler.predicted_hit_rate import PredictedHitRatePolicy
from pddflow.scheduler.uncached_threshold import UncachedThresholdPolicy

ROOT = Path(__file__).resolve().parents[2]
GRAPHS = (
    sorted((ROOT / "graphs").glob("*.yaml"))
    + sorted((ROOT / "graphs" / "examples").glob("*.yaml"))
    + sorted((ROOT / "graphs" / "sim").glob("*.yaml"))
)


def plan(name: str):
    return load_plan(str(ROOT / "graphs" / name))


def req(
    tokens: int = 32768, out: int = 1000, rid: str = "r", start: int = 0, bt: int = 512
) -> RequestFeatures:
    n = -(-tokens // bt)
    return RequestFeatures(rid, tokens, tuple(range(start, start + n)), out, bt)


@pytest.mark.parametrize("path", GRAPHS, ids=[p.name for p in GRAPHS])
def test_every_shipped_plan_gets_a_complete_decision(path: Path):
    p = load_plan(str(path))
    policy = make_policy(p)
    d = policy.decide(req(), SchedulerState.for_plan(p))
    assert d.variant in p.variants
    assert [op for op, _ in d.targets] == list(p.variants[d.variant].path)
    for op, inst in d.targets:
        assert inst in p.operators[op].instances


def test_make_policy_resolves_the_registry_impl():
    assert isinstance(make_policy(plan("pdd.yaml")), PredictedHitRatePolicy)
    assert isinstance(make_policy(plan("cross_dc_pd.yaml")), FirstVariantPolicy)
    assert isinstance(
        make_policy(plan("examples/prfaas_remote_prefill.yaml")), UncachedThresholdPolicy
    )
    bad = replace(
        plan("pdd.yaml"), scheduler=replace(plan("pdd.yaml").scheduler, policy="predicted_hitrate")
    )
    with pytest.raises(UnknownName, match="did you mean 'predicted_hit_rate'"):
        make_policy(bad)


def congested(st: SchedulerState, gbps: float = 0.8) -> None:
    """The A-B link as measured under load: a new flow would get `gbps`."""
    st.set_link(
        LinkEstimate(
            "A-B",
            bytes_per_s=gbps * 1e9 / 8,
            rtt_s=0.03,
            delay_p50_s=0.05,
            delay_p90_s=0.4,
            delay_p99_s=2.0,
            active_flows=30,
        )
    )


def test_sla_only_sends_a_cold_request_direct_while_it_meets_the_sla():
    p = plan("pdd.yaml")
    pol, st = make_policy(p, {"relay_if_transfer_over_s": 0.0}), SchedulerState.for_plan(p)
    # 32K tokens x 320 KiB over an idle 100 Gbps link: 2.9 s at P99 (jitter P99 2 s), within 5 s
    cold = pol.decide(req(rid="cold"), st)
    assert cold.variant == "p_md" and cold.predicted_hit == 0.0
    assert 0.5 < cold.predicted_transfer_s < p.scheduler.ttft_s
    assert "<= SLA 5s" in cold.reason and "transfer P99 2.89s" in cold.reason


def test_by_default_a_slow_transfer_takes_the_relay_within_the_sla_too():
    p = plan("pdd.yaml")
    pol, st = make_policy(p), SchedulerState.for_plan(p)
    d = pol.decide(req(rid="cold"), st)
    assert d.variant == "p_rld_md" and d.predicted_transfer_s > 0.5
    assert "transfer P90 1.27s > 0.5s" in d.reason and "<= SLA 5s" in d.reason


def test_direct_path_breaking_the_ttft_sla_takes_the_relay():
    p = plan("pdd.yaml")
    pol, st = make_policy(p), SchedulerState.for_plan(p)
    congested(st)  # 10.7 GB at 0.1 GB/s: 107 s
    d = pol.decide(req(rid="slow-link"), st)
    assert d.variant == "p_rld_md" and "> SLA 5s" in d.reason
    st.mirrors["main/0"].on_insert(range(64))  # main/0 holds the whole prompt: nothing crosses
    warm = pol.decide(req(rid="warm"), st)
    assert warm.variant == "p_md" and warm.target("main") == "main/0"
    assert warm.predicted_hit == 1.0 and warm.transfer_bytes == 0


def test_prefill_queue_counts_against_the_sla():
    p = plan("pdd.yaml")
    pol, st = make_policy(p, {"relay_if_transfer_over_s": 0.0}), SchedulerState.for_plan(p)
    for inst in p.operators["prefill"].instances:
        st.prefill_s_per_token[inst] = 20e-6  # 50K tokens/s measured
        st.set_load(inst, InstanceLoad(queued_tokens=200_000))  # 4 s queued before this prompt
    d = pol.decide(req(rid="queued"), st)  # 4 s + 0.66 s prefill + 2.89 s transfer > 5 s
    assert d.variant == "p_rld_md" and "queue+prefill 4.66s" in d.reason
    for inst in p.operators["prefill"].instances:
        st.set_load(inst, InstanceLoad(queued_tokens=0))
    assert pol.decide(req(rid="idle"), st).variant == "p_md"


def test_saturated_relays_fall_back_to_direct():
    p = plan("pdd.yaml")
    pol, st = make_policy(p), SchedulerState.for_plan(p)
    congested(st)
    for inst in p.operators["relay"].instances:
        st.set_load(inst, InstanceLoad(running=64, max_batch=64))
    d = pol.decide(req(), st)
    assert d.variant == "p_md" and "saturated" in d.reason


def test_adaptive_handoff_follows_relay_load():
    p = plan("pdd.yaml")
    pol, st = make_policy(p), SchedulerState.for_plan(p)
    congested(st)
    assert pol.decide(req(rid="a"), st).handoff == "catch_up"  # idle relay: keep generating
    for inst in p.operators["relay"].instances:
        st.set_load(inst, InstanceLoad(running=50, max_batch=64))  # 0.78 > catch_up_load 0.7
    d = pol.decide(req(rid="b"), st)
    assert d.variant == "p_rld_md" and d.handoff == "one_shot"


def test_slow_link_estimate_moves_warmish_requests_to_the_relay():
    p = plan("pdd.yaml")
    pol, st = make_policy(p), SchedulerState.for_plan(p)
    st.mirrors["main/0"].on_insert(range(60))  # 60 of 64 blocks cached
    assert pol.decide(req(rid="a"), st).variant == "p_md"
    congested(st, gbps=0.05)  # 4 blocks of 320 KiB/token: 2048 x 320 KiB at 6 MB/s
    assert pol.decide(req(rid="b"), st).variant == "p_rld_md"


def test_singular_traffic_is_bounded():
    p = plan("pdd.yaml")
    pol, st = make_policy(p), SchedulerState.for_plan(p)
    share = pol.params["singular_max_share"]
    congested(st)
    long_short = [pol.decide(req(40000, 100, rid=f"s{i}", start=i * 1000), st) for i in range(200)]
    singular = [d for d in long_short if d.singular]
    # relay finishes, WAN leg cancelled
    assert singular and all(d.variant == "p_rld_md" for d in singular)
    assert len(singular) <= share * 200 + 1
    normal = pol.decide(req(40000, 2000, rid="n"), st)
    assert not normal.singular


def test_singular_needs_a_relay_or_singular_variant():
    p = plan("cross_dc_pd.yaml")
    pol = PredictedHitRatePolicy(p)
    d = pol.decide(req(40000, 100), SchedulerState.for_plan(p))
    assert not d.singular and d.variant == "p_md"


def test_three_dc_picks_the_pool_holding_the_prefix():
    p = plan("examples/three_dc_two_main_pools.yaml")
    pol, st = make_policy(p), SchedulerState.for_plan(p)
    # a 128K prompt: cold over A-B (100 Gbps) lands later than fully cached over the slower A-C
    st.mirrors["main_c/2"].on_insert(range(256))
    d = pol.decide(req(131072), st)
    assert d.variant in ("p_mdc", "p_rld_mdc") and d.target(d.targets[-1][0]) == "main_c/2"
    assert d.predicted_hit == 1.0
    st.mirrors["main_b/5"].on_insert(range(256))  # now the faster link's pool has it too
    d = pol.decide(req(131072, rid="b"), st)
    assert d.variant == "p_mdb" and d.target("main_b") == "main_b/5"


def test_uncached_threshold_prfaas():
    p = plan("examples/prfaas_remote_prefill.yaml")
    pol, st = make_policy(p), SchedulerState.for_plan(p)
    assert pol.decide(req(32768), st).variant == "remote"  # 32K uncached > 8192
    assert pol.decide(req(4096), st).variant == "local"
    st.mirrors["decode/1"].on_insert(range(60))  # 4 of 64 blocks uncached
    d = pol.decide(req(32768, rid="w"), st)
    assert d.variant == "local" and d.target("decode") == "decode/1"


def test_first_variant_is_cache_aware_and_load_guarded():
    p = plan("same_dc_pd.yaml")
    pol, st = make_policy(p), SchedulerState.for_plan(p)
    st.mirrors["decode/4"].on_insert(range(64))
    assert pol.decide(req(), st).target("decode") == "decode/4"
    # full: the prefix is not worth it
    st.set_load("decode/4", InstanceLoad(running=64, max_batch=64))
    assert pol.decide(req(rid="b"), st).target("decode") != "decode/4"


def test_prefill_instance_minimises_queued_plus_uncached_tokens():
    p = plan("pdd.yaml")
    pol, st = make_policy(p), SchedulerState.for_plan(p)
    st.mirrors["prefill/2"].on_insert(range(64))
    assert pol.decide(req(), st).target("prefill") == "prefill/2"
    st.set_load("prefill/2", InstanceLoad(queued_tokens=10**6))
    assert pol.decide(req(rid="b"), st).target("prefill") != "prefill/2"


def test_singular_expects_only_what_a_router_can_know():
    p = plan("pdd.yaml")
    pol, st = make_policy(p), SchedulerState.for_plan(p)
    congested(st)
    pol.params["singular_max_share"] = 1.0
    # a trace replay: no max_tokens, no outputs seen yet for prompts of this size
    assert not pol.decide(req(40000, 0, rid="a"), st).singular
    for _ in range(8):
        pol.finished(40000, 120)  # outputs of 40K-token prompts run to about 120 tokens
    d = pol.decide(req(40000, 0, rid="b"), st)
    assert d.singular and "120 out expected" in d.reason
    pol.finished(1000, 5000)  # another prompt size does not count
    for _ in range(8):
        pol.finished(40000, 900)
    assert not pol.decide(req(40000, 0, rid="d"), st).singular  # median now 900 > 500
    assert pol.decide(req(40000, 100, rid="e"), st).singular  # max_tokens caps what to expect


def test_local_profile_scales_the_policy_thresholds():
    from pddflow.graph.diagnostics import GraphError

    p = plan("pdd.yaml")
    assert make_policy(p).params["singular_min_prompt_tokens"] == 16384
    local = make_policy(p.scaled_to_local()).params
    assert (local["singular_min_prompt_tokens"], local["singular_max_output_tokens"]) == (1024, 32)
    assert local["singular_max_share"] == 0.04  # what the profile does not name stays
    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    bad = text.replace("singular_min_prompt_tokens: 1024", "singular_min_prompt: 1024")
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(bad)
        f.flush()
        with pytest.raises(GraphError, match="did you mean 'singular_min_prompt_tokens'"):
            load_plan(f.name)


def test_a_hit_below_the_device_costs_its_load():
    """pdd_tiered: main holds the whole prompt; on its device the direct path costs only the WAN's
    latency (P90 ~0.4 s), but a load from host memory (25 GB/s: 0.43 s) or disk (5 GB/s: 2.1 s)
    comes on top and passes relay_if_transfer_over_s (0.5 s): the relay hides it."""
    p = plan("pdd_tiered.yaml")
    pol, st = make_policy(p), SchedulerState.for_plan(p)
    r = req(rid="warm")
    n = len(r.block_hashes)
    for tier, variant in ((0, "p_md"), (1, "p_rld_md"), (2, "p_rld_md")):
        m = st.mirrors["main/0"]
        m.reset(r.block_hashes, [tier] * n)
        d = pol.decide(r, st)
        assert d.predicted_hit == 1.0 and d.transfer_bytes == 0
        assert d.variant == variant, (tier, d.reason)
        load = pol.tier_load_s("main/0", r, n, st)
        assert load == pytest.approx([0.0, 0.43, 2.15][tier], rel=0.02), (
            "32K tokens x 320 KiB at the tier's GB/s"
        )
    # a measured rate replaces the declared one
    from pddflow.runtime.proto import runtime_pb2 as pb

    st.measured_tiers("main/0", [pb.TierStats(tier="disk", loaded_bytes=10**9, load_s=0.001)])
    assert pol.decide(r, st).variant == "p_md"
