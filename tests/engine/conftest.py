"""Shared fixtures for the engine tests: tiny HF checkpoints written with save_pretrained, and a
small model built straight from a config (no transformers needed) for the property tests."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from pddflow.core.model_config import ModelConfig, RopeScaling
from pddflow.operators.engine import Engine, EngineConfig
from pddflow.operators.weights import ModelSource, builtin_weights

# Small enough for hundreds of forwards per second on 2 cores, large enough to have GQA (2 query
# heads per KV head), llama3 RoPE scaling that matters at these positions, and several layers.
SMALL = ModelConfig(
    arch="llama",
    vocab_size=97,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    rope_scaling=RopeScaling(
        "llama3",
        factor=4.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=32,
    ),
    max_position_embeddings=1024,
)


# the same, its MLPs a mixture of 4 experts, 2 per token (Mixtral's routing)
SMALL_MOE = replace(
    SMALL, arch="mixtral", num_experts=4, experts_per_token=2, moe_intermediate_size=32
)

# DeepSeek-V3's shape: latent attention (latent 32 + RoPE 16 as the one KV head, a query LoRA,
# interleaved RoPE with YaRN), a dense first layer, then 8 experts in 4 groups (2 kept), 2 per
# token by biased sigmoid scores, and a shared expert
SMALL_MLA = replace(
    SMALL,
    arch="deepseek_v3",
    num_kv_heads=1,
    head_dim=48,
    kv_lora_rank=32,
    q_lora_rank=24,
    qk_nope_head_dim=16,
    qk_rope_head_dim=16,
    v_head_dim=24,
    rope_interleave=True,
    rope_scaling=RopeScaling(
        "yarn", factor=4.0, original_max_position_embeddings=32, mscale=1.0, mscale_all_dim=0.8
    ),
    num_experts=8,
    experts_per_token=2,
    moe_intermediate_size=32,
    dense_layers=(0,),
    shared_experts=1,
    router="noaux_tc",
    router_groups=4,
    router_topk_groups=2,
    routed_scaling_factor=2.5,
    router_bias=True,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models spend their time in thread hand-offs, and on a shared 2-core machine an OpenMP
    barrier can wait a whole time slice: one thread runs these tests ~10x faster. Restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_source(seed: int = 0, config: ModelConfig = SMALL) -> ModelSource:
    return ModelSource("small", config, builtin_weights(config, seed), None)


def small_engine(config: ModelConfig = SMALL, **overrides) -> Engine:
    cfg = dict(block_size=4, attention_tile=16, chunk_size=64, kv_cache_bytes=4 * 2**20)
    cfg.update(overrides)
    return Engine(small_source(config=config), EngineConfig(**cfg))


def _llama_config(**extra):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=211,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        **extra,
    )


def _save(model, path: Path) -> Path:
    # HF's N(0, 0.02) init makes greedy decoding repeat one token; unit-scale embeddings keep the
    # continuation varied, so a 40-token comparison actually tests something.
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return _save(
        transformers.LlamaForCausalLM(_llama_config()), tmp_path_factory.mktemp("tiny-llama")
    )


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> Path:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    cfg = transformers.Qwen2Config(
        vocab_size=211,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        # Tied embeddings make a small-weight model echo its input token; stronger layers and
        # nonzero q/k/v biases (HF inits them to zero) make the bias path and the layers matter.
        for name, p in model.named_parameters():
            if name.endswith("proj.weight"):
                p.normal_(0.0, 0.2)
            elif name.endswith("proj.bias"):
                p.normal_(0.0, 0.5)
    return _save(model, tmp_path_factory.mktemp("tiny-qwen2"))


def _tiny(tmp_path_factory, arch: str, seed: int) -> Path:
    """pddflow.testing.tiny_checkpoints' `tiny_<arch>` checkpoint, with its tokenizer."""
    pytest.importorskip("transformers")
    from pddflow.testing import tiny_checkpoints

    make = getattr(tiny_checkpoints, f"tiny_{arch}")
    return make(tmp_path_factory.mktemp(f"tiny-{arch}"), seed=seed)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory) -> Path:
    return _tiny(tmp_path_factory, "qwen3", 2)


@pytest.fixture(scope="session")
def tiny_mistral_dir(tmp_path_factory) -> Path:
    return _tiny(tmp_path_factory, "mistral", 3)


@pytest.fixture(scope="session")
def tiny_qwen3_moe_dir(tmp_path_factory) -> Path:
    return _tiny(tmp_path_factory, "qwen3_moe", 4)


@pytest.fixture(scope="session")
def tiny_mixtral_dir(tmp_path_factory) -> Path:
    return _tiny(tmp_path_factory, "mixtral", 5)


@pytest.fixture(scope="session")
def tiny_deepseek_v2_dir(tmp_path_factory) -> Path:
    return _tiny(tmp_path_factory, "deepseek_v2", 6)


@pytest.fixture(scope="session")
def tiny_deepseek_v3_dir(tmp_path_factory) -> Path:
    return _tiny(tmp_path_factory, "deepseek_v3", 7)


@pytest.fixture(scope="session")
def tiny_llama_with_tokenizer(tiny_llama_dir, tmp_path_factory) -> Path:
    """The tiny Llama checkpoint plus a word-level tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = tmp_path_factory.mktemp("tiny-llama-tok")
    for f in tiny_llama_dir.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(208)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))
    return d


def with_config(path: Path, tmp_path: Path, **changes) -> Path:
    """Copy a checkpoint directory with config.json keys replaced (None deletes a key)."""
    out = tmp_path / "ckpt"
    out.mkdir()
    for f in path.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((out / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (out / "config.json").write_text(json.dumps(cfg))
    return out


__all__ = ["SMALL", "SMALL_MOE", "small_source", "small_engine", "with_config"]
