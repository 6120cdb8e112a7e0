"""The compiler: Plan contents, placement, local scaling and JSON round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pddflow.graph import GraphError, Plan, load_plan

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "graphs").glob("*.yaml")) + sorted(
    (ROOT / "graphs" / "examples").glob("*.yaml")
)


def test_shipped_graphs_are_the_expected_set():
    names = {p.name for p in SHIPPED}
    assert {
        "pdd.yaml",
        "pdd_threshold.yaml",
        "cross_dc_pd.yaml",
        "same_dc_pd.yaml",
        "colocated.yaml",
    } <= names
    assert len([p for p in SHIPPED if p.parent.name == "examples"]) >= 2


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_graph_compiles_and_round_trips(path: Path):
    plan = load_plan(str(path))
    assert Plan.from_json(plan.to_json()) == plan
    local = plan.scaled_to_local()
    assert local.profile == "local"
    assert Plan.from_json(local.to_json()) == local
    if path.parent.name == "graphs":
        assert plan.model.weights == "builtin:tiny-llama"


@pytest.mark.parametrize(
    "weights, expected",
    [("acme/tiny-model", "acme/tiny-model"), ("ckpt/tiny", "{dir}/ckpt/tiny")],
)
def test_model_weights_hub_id_or_relative_path(tmp_path, weights, expected):
    """A Hub id stays an id (deploy resolves it through the Hub cache); a path that exists next
    to the graph is that path."""
    (tmp_path / "ckpt" / "tiny").mkdir(parents=True)
    text = (ROOT / "graphs" / "pdd.yaml").read_text().replace("builtin:tiny-llama", weights)
    graph = tmp_path / "g.yaml"
    graph.write_text(text)
    assert load_plan(str(graph)).model.weights == expected.format(dir=tmp_path)


def test_pdd_plan_contents():
    plan = load_plan(str(ROOT / "graphs" / "pdd.yaml"))
    assert plan.operators["relay"].instances == ("relay/0", "relay/1")
    assert plan.operator_of("relay/1") is plan.operators["relay"]
    assert len(plan.instances) == 8 + 2 + 10
    wan = plan.channel("prefill.kv->main.kv")
    assert (wan.kind, wan.cross_cluster, wan.link, wan.payload) == (
        "wan_flight",
        True,
        "A-B",
        "KVBlocks",
    )
    assert wan.params["streams"] == 4 and wan.params["deadline_s"] == 30.0  # default filled in
    rdma = plan.channel("prefill.kv->relay.kv")
    assert (rdma.cross_cluster, rdma.link) == (False, None)
    v = plan.variants["p_rld_md"]
    assert v.path == ("prefill", "relay", "main") and v.handoff == "adaptive"
    assert set(v.channels) == {
        "prefill.kv->relay.kv",
        "prefill.kv->main.kv",
        "relay.handoff->main.handoff",
    }
    assert plan.variants["p_md"].channels == ("prefill.kv->main.kv",)
    assert plan.operators["main"].params["radix_cache"] is True
    assert plan.scheduler.policy == "predicted_hit_rate" and plan.scheduler.ttft_s == 5
    assert plan.cost_per_hour() == pytest.approx(8 * 4 * 2.0 + 2 * 4 * 2.0 + 10 * 4 * 1.6)


def test_plan_as_networkx():
    import networkx as nx

    g = load_plan(str(ROOT / "graphs" / "pdd.yaml")).to_networkx()
    assert set(g.nodes) == {"prefill", "relay", "main"}
    assert g.nodes["main"]["cluster"] == "B"
    assert g.edges["prefill", "main", "prefill.kv->main.kv"]["kind"] == "wan_flight"
    assert nx.is_directed_acyclic_graph(g)
    assert list(nx.topological_sort(g))[0] == "prefill"


def test_placement_memory_budget():
    plan = load_plan(str(ROOT / "graphs" / "pdd.yaml"))
    op = plan.operators[
        "prefill"
    ]  # 4 x 80 GiB at 90% usable, minus Llama-3-70B's 141.2 GB of weights
    assert op.kv_budget_bytes == pytest.approx(0.9 * 4 * 80 * 2**30 - 141.2e9)
    local = plan.scaled_to_local()
    assert [i.id for i in local.instances] == ["prefill/0", "relay/0", "main/0"]


def test_load_plan_raises_with_every_diagnostic(tmp_path: Path):
    text = (Path(__file__).parent / "base.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        text.replace("op: prefill,", "op: prefil,").replace(
            "policy: predicted_hit_rate", "policy: x"
        )
    )
    with pytest.raises(GraphError) as exc:
        load_plan(str(bad))
    assert {d.line for d in exc.value.diagnostics} == {16, 27}


def test_checkpoint_path_is_resolved_relative_to_the_graph(tmp_path: Path):
    text = (Path(__file__).parent / "base.yaml").read_text().replace("builtin:tiny-llama", "ckpt")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    g = tmp_path / "g.yaml"
    g.write_text(text)
    assert load_plan(str(g)).model.weights == str(tmp_path / "ckpt")


def test_the_local_profile_sets_the_deployed_layout(tmp_path: Path):
    """local.devices_per_replica: rank processes per instance as deployed (default: the
    operator's devices_per_replica); the production shape the simulator times stays."""
    plan = load_plan(str(ROOT / "graphs" / "pdd.yaml"))
    assert {op.ranks for op in plan.operators.values()} == {4}  # production: every device
    local = plan.scaled_to_local()
    assert {op.ranks for op in local.operators.values()} == {1}  # the shipped local profile
    assert {op.devices_per_replica for op in local.operators.values()} == {4}
    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    two = tmp_path / "two.yaml"
    one = "devices_per_replica: {prefill: 1, relay: 1, main: 1}"
    two.write_text(text.replace(one, "devices_per_replica: {prefill: 2, main: 4}"))
    local = load_plan(str(two)).scaled_to_local()
    ops = local.operators
    assert (ops["prefill"].ranks, ops["relay"].ranks, ops["main"].ranks) == (2, 4, 4)
    assert len(local.instances) == 3 and local.rank_processes("main/0")[-1] == "main/0#3"


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("{prefill: 8}", "local devices_per_replica of prefill is 8 but a replica of it has 4"),
        ("{prefill: 0}", "local devices_per_replica must be >= 1, got 0"),
        ("{prefil: 1}", "local profile names operator 'prefil', which is not defined"),
    ],
)
def test_a_local_layout_that_cannot_run_is_refused(tmp_path: Path, layout: str, message: str):
    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    one = "devices_per_replica: {prefill: 1, relay: 1, main: 1}"
    assert one in text
    bad.write_text(text.replace(one, f"devices_per_replica: {layout}"))
    with pytest.raises(GraphError) as exc:
        load_plan(str(bad))
    assert any(message in str(d) for d in exc.value.diagnostics), exc.value.diagnostics


def test_arch_checkpoint_reads_the_weights_config(tmp_path: Path):
    """arch: checkpoint plans with the served model's own numbers: a mixture of experts' active
    parameters, its dtype's bytes; the built-in model's equal its preset; no config.json is one
    error on model.arch naming the fix."""
    import json

    from pddflow.core.arch import ARCHS

    text = (Path(__file__).parent / "base.yaml").read_text()
    assert "arch: llama-3-70b" in text
    graph = tmp_path / "g.yaml"
    graph.write_text(text.replace("arch: llama-3-70b", "arch: checkpoint"))
    builtin = load_plan(str(graph)).model.arch
    preset = ARCHS.get("tiny-llama")
    assert (builtin.kv_bytes_per_token, builtin.flops_per_token, builtin.weight_bytes) == (
        preset.kv_bytes_per_token,
        preset.flops_per_token,
        preset.weight_bytes,
    )
    moe = {
        "model_type": "qwen3_moe",
        "vocab_size": 1000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "dtype": "bfloat16",
    }
    (tmp_path / "moe").mkdir()
    (tmp_path / "moe" / "config.json").write_text(json.dumps(moe))
    graph.write_text(
        text.replace("arch: llama-3-70b", "arch: checkpoint").replace("builtin:tiny-llama", "moe")
    )
    arch = load_plan(str(graph)).model.arch
    assert arch.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2  # layers x K,V x KV heads x dim x bf16
    expert, attn = 3 * 64 * 32, 64 * (64 + 2 * 32) + 64 * 64 + 2 * 16 + 2 * 64
    per_layer_active = attn + 2 * expert + 8 * 64
    assert arch.flops_per_token == 2 * (2 * per_layer_active + 2 * 1000 * 64 + 64)
    assert arch.weight_bytes == 2 * (2 * (attn + 8 * expert + 8 * 64) + 2 * 1000 * 64 + 64)
    graph.write_text(
        text.replace("arch: llama-3-70b", "arch: checkpoint").replace("builtin:tiny-llama", "none")
    )
    with pytest.raises(GraphError) as exc:
        load_plan(str(graph))
    line = text.splitlines().index("  arch: llama-3-70b") + 1
    (err,) = [d for d in exc.value.diagnostics if d.severity == "error"]
    assert err.line == line and "download it first, or name an arch preset" in err.message


def test_local_max_replicas_bounds_live_scaling(tmp_path: Path):
    """max_replicas: the instances wired for scaling (a round trip through the wiring's JSON
    keeps them); fewer than the replicas it starts with is an error on that line."""
    from pddflow.graph.plan import Plan

    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    replicas = "replicas: {prefill: 1, relay: 1, main: 1}"
    graph = tmp_path / "g.yaml"
    graph.write_text(text.replace(replicas, replicas + "\n  max_replicas: {main: 2}"))
    local = load_plan(str(graph)).scaled_to_local()
    assert local.operators["main"].instances == ("main/0", "main/1")
    assert [i.id for i in local.instances][-2:] == ["main/0", "main/1"]
    assert local.initial_instances() == ["prefill/0", "relay/0", "main/0"]
    again = Plan.from_json(json.dumps(local.to_dict()))
    assert again.initial_instances() == local.initial_instances() and again.scalable()
    lines = text.replace(
        replicas, "replicas: {prefill: 1, relay: 1, main: 2}\n  max_replicas: {main: 1}"
    )
    graph.write_text(lines)
    with pytest.raises(GraphError) as exc:
        load_plan(str(graph))
    (err,) = exc.value.diagnostics
    assert "max_replicas of main is 1 but it starts with 2" in err.message
    assert err.line == lines.splitlines().index("  max_replicas: {main: 1}") + 1


def test_autoscale_section(tmp_path: Path):
    """autoscale: the planner's settings (a round trip keeps them) and the production bounds it
    scales within; a min_replicas beyond an operator's replicas, or of no operator, is an error
    on its line."""
    from pddflow.graph.plan import Plan

    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    graph = tmp_path / "g.yaml"
    block = "\nautoscale:\n  interval_s: 2\n  min_replicas: {main: 3}\n"
    graph.write_text(text + block)
    plan = load_plan(str(graph))
    assert plan.autoscale.interval_s == 2 and not plan.autoscale.enabled
    assert plan.pool_bounds() == {"prefill": (1, 8), "relay": (1, 2), "main": (3, 10)}
    assert Plan.from_json(json.dumps(plan.to_dict())).autoscale == plan.autoscale
    for bad, says in (
        ("{main: 11}", "scales it within min..10"),
        ("{mian: 1}", "did you mean 'main'"),
    ):
        lines = text + block.replace("{main: 3}", bad)
        graph.write_text(lines)
        with pytest.raises(GraphError) as exc:
            load_plan(str(graph))
        (err,) = exc.value.diagnostics
        assert says in err.message, err.message
        assert err.line == lines.splitlines().index(f"  min_replicas: {bad}") + 1


# DeepSeek-V3's published config.json (the keys planning reads; weights in fp8, KV served in bf16)
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc",
    "n_group": 8,
    "topk_group": 4,
    "num_experts_per_tok": 8,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 3,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_deepseek_v3_planned_from_its_config_is_its_preset():
    """Planning from DeepSeek-V3's own config.json (arch: checkpoint) gives the deepseek-v3
    preset's KV bytes per token (one latent + RoPE key per layer, whatever the head count) and
    attention FLOPs, and its published 671B parameters of which 37B are active."""
    from pddflow.core.arch import ARCHS
    from pddflow.core.hf_config import config_from_hf

    config = config_from_hf(DEEPSEEK_V3)
    planned, preset = config.planning_arch("checkpoint", dtype_bytes=2), ARCHS.get("deepseek-v3")
    assert planned.kv_bytes_per_token == preset.kv_bytes_per_token == 576 * 61 * 2
    assert planned.attention_flops_per_pair == preset.attention_flops_per_pair
    assert round(config.num_params() / 1e9) == 671
    assert round(config.num_params(active=True) / 1e9) == 38  # 37.6: "37B activated"
    assert planned.flops_per_token == pytest.approx(preset.flops_per_token, rel=0.02)


def test_the_frontend_lives_in_a_cluster(tmp_path: Path):
    """deploy.frontend_cluster: where the API runs (default the first cluster); the link to each
    other cluster is the one its control connections cross."""
    plan = load_plan(str(ROOT / "graphs" / "pdd.yaml"))
    assert plan.frontend_cluster == "A" and plan.deploy.lease_s == 10.0
    assert plan.link_between("A", "B") == plan.link_between("B", "A") == "A-B"
    assert plan.link_between("A", "A") is None
    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    g = tmp_path / "g.yaml"
    g.write_text(
        text.replace(
            "\nscheduler:\n", "\ndeploy: {frontend_cluster: B, lease_s: 3}\nscheduler:\n", 1
        )
    )
    moved = load_plan(str(g))
    assert (moved.frontend_cluster, moved.deploy.lease_s) == ("B", 3.0)
    assert Plan.from_json(moved.to_json()) == moved
    g.write_text(text.replace("\nscheduler:\n", "\ndeploy: {frontend_cluster: b}\nscheduler:\n", 1))
    with pytest.raises(GraphError, match=r"frontend_cluster 'b' is not a cluster.*clusters: A, B"):
        load_plan(str(g))
