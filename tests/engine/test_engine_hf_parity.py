"""The engine against transformers on the same weights: logits within 1e-4 (fp32) and identical
greedy continuations, for Llama (GQA, llama3 RoPE scaling), Qwen2 (q/k/v bias, tied embeddings),
Qwen3 (per-head q/k RMSNorm, head_dim apart from hidden / heads), Mistral, the mixtures of
experts Qwen3-MoE (a dense layer among MoE ones) and Mixtral, and DeepSeek-V2-Lite and V3 shapes
(latent attention, YaRN, shared experts, softmax and biased-sigmoid group routing)."""

import pytest
import torch
from conftest import with_config

from pddflow.core.hf_config import config_from_hf
from pddflow.core.model_config import ModelSpecError
from pddflow.core.payloads import SamplingParams
from pddflow.operators.engine import Engine, EngineConfig
from pddflow.operators.weights import load_model_source

PROMPT = [
    int(t)
    for t in "1 17 99 3 150 42 8 8 200 5 61 77 13 190 4 33 120 9 56 71 2 140 35 88 101 6 19 170 "
    "24 66 91 12 180 45 7".split()
]


ARCH_FIXTURES = [
    "tiny_llama_dir",
    "tiny_qwen2_dir",
    "tiny_qwen3_dir",
    "tiny_mistral_dir",
    "tiny_qwen3_moe_dir",
    "tiny_mixtral_dir",
    "tiny_deepseek_v2_dir",
    "tiny_deepseek_v3_dir",
]


def _hf(path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ARCH_FIXTURES)
def test_logits_match_hf(fixture, request):
    path = request.getfixturevalue(fixture)
    engine = Engine.from_spec(str(path), EngineConfig(kv_cache_bytes=2**22, chunk_size=16))
    hf = _hf(path)
    with torch.inference_mode():
        ref = hf(torch.tensor([PROMPT])).logits[0]
    ours = engine.score(PROMPT)  # chunked in 16s: exercises cross-chunk attention too
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ARCH_FIXTURES)
def test_greedy_continuation_matches_hf(fixture, request):
    path = request.getfixturevalue(fixture)
    n = 40
    engine = Engine.from_spec(str(path), EngineConfig(kv_cache_bytes=2**22))
    hf = _hf(path)
    hf.generation_config.eos_token_id = None  # both run n tokens, EOS an ordinary token
    with torch.inference_mode():
        out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    ref = out[0, len(PROMPT) :].tolist()
    ours = engine.generate([PROMPT], SamplingParams(max_tokens=n))[0].output_ids
    assert len(set(ref)) > 3, "degenerate test model"
    assert ours == ref


@pytest.mark.slow
def test_builtin_tiny_llama_matches_hf():
    pytest.importorskip("transformers")
    from pddflow.operators.hf_reference import hf_model_from_source

    source = load_model_source("builtin:tiny-llama")
    c = source.config
    assert c.kv_bytes_per_token(4) == 32 * 1024 and c.num_kv_heads < c.num_heads
    hf = hf_model_from_source(source)
    engine = Engine(source, EngineConfig(kv_cache_bytes=2**24))
    ids = [256] + list(b"The Extend-Decode handoff sends token IDs, not KV.")
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0]
    assert (engine.score(ids) - ref).abs().max().item() < 1e-4


@pytest.mark.slow  # draws the 47M built-in weights twice
def test_builtin_weights_are_deterministic():
    a = load_model_source("builtin:tiny-llama").weights["model.layers.3.mlp.up_proj.weight"]
    b = load_model_source("builtin:tiny-llama").weights["model.layers.3.mlp.up_proj.weight"]
    assert torch.equal(a, b)


@pytest.mark.slow  # builds the HF checkpoint fixture
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' (LlamaForCausalLM) is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        (
            {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}},
            "RoPE type 'longrope'",
        ),
        ({"num_hidden_layers": None}, "lacks required key 'num_hidden_layers'"),
        ({"num_hidden_layers": 5}, "checkpoint lacks model.layers.3"),
        ({"hidden_size": 32}, "has shape"),
    ],
)
def test_bad_checkpoints_give_clear_errors(tiny_llama_dir, tmp_path, changes, message):
    path = with_config(tiny_llama_dir, tmp_path, **changes)
    with pytest.raises(ModelSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model_source(str(path))


@pytest.mark.slow  # builds the HF checkpoint fixture
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"num_experts_per_tok": 9}, "num_experts_per_tok (9) must be in 1..num_experts (8)"),
        ({"shared_expert_intermediate_size": 16}, "shared experts are not supported"),
        ({"num_local_experts": 9}, "checkpoint lacks model.layers.0.mlp.experts.8"),
        ({"moe_intermediate_size": 16}, "experts.0.gate_proj.weight has shape"),
        ({"num_local_experts": 0, "num_experts": None}, "names no experts"),
    ],
)
def test_bad_moe_checkpoints_give_clear_errors(tiny_qwen3_moe_dir, tmp_path, changes, message):
    path = with_config(tiny_qwen3_moe_dir, tmp_path, **changes)
    with pytest.raises(ModelSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model_source(str(path))


def test_an_moe_config_names_its_dense_and_expert_layers():
    """Qwen3-MoE's mlp_only_layers and decoder_sparse_step; Mixtral's experts everywhere, as
    wide as its MLP; parameters: every expert, or the chosen ones (`active`)."""

    base = {
        "vocab_size": 100,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 6,
        "num_attention_heads": 2,
        "num_experts_per_tok": 2,
    }
    q = config_from_hf(
        {
            **base,
            "model_type": "qwen3_moe",
            "num_experts": 4,
            "moe_intermediate_size": 4,
            "decoder_sparse_step": 2,
            "mlp_only_layers": [3],
            "norm_topk_prob": True,
        }
    )
    assert [q.moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    assert q.qk_norm and q.norm_topk_prob and q.moe_intermediate_size == 4
    m = config_from_hf({**base, "model_type": "mixtral", "num_local_experts": 4})
    assert all(m.moe_layer(i) for i in range(6)) and m.moe_intermediate_size == 16
    expert = 3 * 8 * 16
    assert m.num_params() - m.num_params(active=True) == 6 * 2 * expert


DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "vocab_size": 100,
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_experts_per_tok": 2,
    "n_routed_experts": 8,
    "n_group": 4,
    "topk_group": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 4,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 12,
    "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 8,
    "v_head_dim": 6,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "beta_fast": 32,
        "beta_slow": 1,
    },
}


def test_a_deepseek_config_keeps_one_latent_per_token():
    """DeepSeek-V3 (its original keys: rope_scaling with `type`): the KV cache is the latent and
    the RoPE key, one copy whatever the head count: (16 + 4) x 4 layers x 2 B; the first layer
    dense; YaRN's mscale_all_dim in the softmax scale."""
    from pddflow.core.model_config import yarn_mscale

    c = config_from_hf(DEEPSEEK_V3)
    assert (c.num_kv_heads, c.head_dim, c.kv_planes, c.value_dim) == (1, 20, 1, 16)
    assert c.kv_bytes_per_token(2) == (16 + 4) * 4 * 2
    assert [c.moe_layer(i) for i in range(4)] == [False, True, True, True]
    assert (c.router, c.router_bias, c.norm_topk_prob, c.shared_experts) == (
        "noaux_tc",
        True,
        True,
        1,
    )
    assert c.rope_scaling.rope_type == "yarn" and c.rope_scaling.factor == 40
    assert c.softmax_scale == pytest.approx((8 + 4) ** -0.5 * yarn_mscale(40, 1.0) ** 2)
    wider = config_from_hf({**DEEPSEEK_V3, "num_attention_heads": 8, "num_key_value_heads": 8})
    assert wider.kv_bytes_per_token(2) == c.kv_bytes_per_token(2)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"topk_method": "greedy"}, "deepseek_v3: topk_method 'greedy'"),
        ({"model_type": "deepseek_v2", "norm_topk_prob": True}, "norm_topk_prob: true"),
        ({"model_type": "deepseek_v2", "topk_method": "noaux_tc"}, "deepseek_v2: topk_method"),
        ({"n_group": 3}, "8 experts do not split into 3 groups"),
        ({"topk_group": 1, "num_experts_per_tok": 3}, "cannot hold 3 of 8 experts"),
        ({"moe_layer_freq": 2}, "moe_layer_freq 2"),
        ({"kv_lora_rank": None}, "malformed"),
        ({"qk_nope_head_dim": None}, "malformed"),
    ],
)
def test_bad_deepseek_configs_are_refused_in_one_line(changes, message):

    cfg = {**DEEPSEEK_V3, **changes}
    with pytest.raises(ModelSpecError, match=message):
        config_from_hf({k: v for k, v in cfg.items()})


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_deepseek_routers_choose_and_weigh_as_transformers(version):
    """Group-limited routing on scores built to make the group limit bind: V2's
    group_limited_greedy (groups by their best, the rest zeroed) and V3's noaux_tc (groups by
    their two best after the bias, weights from the unbiased sigmoid), against transformers'
    own router modules on the same logits."""
    transformers = pytest.importorskip("transformers")
    from pddflow.operators.mlp import Routing

    gen = torch.Generator().manual_seed(3)
    hidden, experts = 8, 16
    x = torch.randn(64, hidden, generator=gen)
    common = dict(
        hidden_size=hidden,
        num_attention_heads=2,
        n_routed_experts=experts,
        num_experts_per_tok=3,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=1.5,
    )
    if version == "v2":
        cfg = transformers.DeepseekV2Config(**common, topk_method="group_limited_greedy")
        hf = transformers.models.deepseek_v2.modeling_deepseek_v2.DeepseekV2TopkRouter(cfg)
        ours = Routing(3, False, "group_limited_greedy", 4, 2, 1.5)
        bias = None
    else:
        cfg = transformers.DeepseekV3Config(**common, norm_topk_prob=True)
        hf = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3TopkRouter(cfg)
        bias = torch.randn(experts, generator=gen) * 0.5
        hf.e_score_correction_bias.copy_(bias)
        ours = Routing(3, True, "noaux_tc", 4, 2, 1.5)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(experts, hidden, generator=gen))
        _, want_w, want_i = hf(x)
    got_w, got_i = ours(x @ hf.weight.detach().t(), bias)
    order_w, order_g = want_i.sort(-1), got_i.sort(-1)
    assert torch.equal(order_w.values, order_g.values)
    assert torch.allclose(want_w.gather(1, order_w.indices), got_w.gather(1, order_g.indices))
    groups = got_i // (experts // 4)
    assert max(len(set(r.tolist())) for r in groups) <= 2  # the group limit held


def test_checkpoint_without_safetensors(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ModelSpecError, match="safetensors|lacks required key"):
        load_model_source(str(tmp_path))


def test_legacy_rope_scaling_keys_are_read():

    d = {
        "model_type": "llama",
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "rope_theta": 5e5,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    c = config_from_hf(d)
    assert c.rope_theta == 5e5 and c.rope_scaling.rope_type == "llama3" and c.head_dim == 4


def _hf_config(**extra):
    d = {
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "max_position_embeddings": 4096,
    }
    return {**d, **extra}


def test_unsupported_architecture_names_it_and_the_supported_ones():

    with pytest.raises(ModelSpecError) as err:
        config_from_hf(_hf_config(model_type="gemma2", architectures=["Gemma2ForCausalLM"]))
    msg = str(err.value)
    assert "\n" not in msg and "'gemma2' (Gemma2ForCausalLM) is not supported" in msg
    for arch in ("'llama'", "'mistral'", "'qwen2'", "'qwen3'"):
        assert arch in msg


def test_mistral_sliding_window():

    cfg = config_from_hf(_hf_config(model_type="mistral", sliding_window=None))
    assert cfg.arch == "mistral" and not cfg.qk_norm
    # a window at least the context long never cuts anything
    config_from_hf(_hf_config(model_type="mistral", sliding_window=4096))
    with pytest.raises(ModelSpecError, match="sliding_window 1024 is smaller than"):
        config_from_hf(_hf_config(model_type="mistral", sliding_window=1024))


def test_qwen3_config():

    cfg = config_from_hf(_hf_config(model_type="qwen3", head_dim=16))
    assert cfg.qk_norm and not cfg.qkv_bias and cfg.head_dim == 16 and not cfg.tie_word_embeddings
    with pytest.raises(ModelSpecError, match="sliding-window"):
        config_from_hf(_hf_config(model_type="qwen3", use_sliding_window=True))


@pytest.mark.slow  # builds the checkpoint
def test_generation_config_eos_is_honoured(tiny_mistral_dir, tmp_path):
    import json

    path = with_config(tiny_mistral_dir, tmp_path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    source = load_model_source(str(path))
    assert source.config.eos_token_ids == (2, 7) and source.tokenizer.eos_token_ids == (2, 7)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fixture",
    ["tiny_qwen3_moe_dir", "tiny_mixtral_dir", "tiny_deepseek_v2_dir", "tiny_deepseek_v3_dir"],
)
def test_the_hf_reference_of_an_moe_checkpoint_is_transformers_own(fixture, request):
    """bench engine's HF side, built from the engine's weights (each expert named as checkpoints
    name them, fused as transformers 5 holds them), computes what from_pretrained's does."""
    from pddflow.operators.hf_reference import hf_model_from_source

    path = request.getfixturevalue(fixture)
    built = hf_model_from_source(load_model_source(str(path)))
    with torch.inference_mode():
        want = _hf(path)(torch.tensor([PROMPT])).logits
        assert torch.equal(built(torch.tensor([PROMPT])).logits, want)
