"""Model sources: `builtin:<name>` (seeded weights), a local HF checkpoint or a Hub id (resolved to
its cached snapshot by `hub.resolve_model`); weights under their HF names in fp32, so the same dict
loads into `transformers`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pddflow.core.hf_config import read_config
from pddflow.core.model_config import (
    BUILTIN_CONFIGS,
    ModelConfig,
    ModelSpecError,
)
from pddflow.core.registry import did_you_mean
from pddflow.operators.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

if TYPE_CHECKING:
    import torch

BUILTIN_SEED = 0


@dataclass
class ModelSource:
    name: str
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer | None


def load_model_source(spec: str, seed: int = BUILTIN_SEED) -> ModelSource:
    spec = str(spec)
    if spec.startswith("builtin:"):
        config = _builtin_config(spec.split(":", 1)[1])
        return ModelSource(spec, config, builtin_weights(config, seed), ByteTokenizer())
    from pddflow.operators.hub import resolve_model

    return _load_checkpoint(Path(resolve_model(spec)))


def model_config_of(spec: str) -> ModelConfig:
    """The model's configuration alone, no weights or tokenizer read, no torch: what a modeled
    engine's worker stands for."""
    spec = str(spec)
    if spec.startswith("builtin:"):
        return _builtin_config(spec.split(":", 1)[1])
    from pddflow.operators.hub import resolve_model

    return read_config(Path(resolve_model(spec)))


def model_without_weights(spec: str) -> ModelSource:
    """The model's configuration and tokenizer, no weights read and no torch: what a modeled
    engine's colocated reference (operators/modeled_engine.py) stands for."""
    config = model_config_of(spec)
    if str(spec).startswith("builtin:"):
        return ModelSource(str(spec), config, {}, ByteTokenizer())
    from pddflow.operators.hub import resolve_model

    path = Path(resolve_model(spec))
    return ModelSource(str(path), config, {}, _tokenizer(path, config))


def _tokenizer(path: Path, config: ModelConfig) -> Tokenizer | None:
    tok_file = path / "tokenizer.json"
    return HFTokenizer(tok_file, config.eos_token_ids) if tok_file.is_file() else None


def _builtin_config(name: str) -> ModelConfig:
    if name not in BUILTIN_CONFIGS:
        valid = sorted(BUILTIN_CONFIGS)
        raise ModelSpecError(
            f"unknown builtin model {name!r}{did_you_mean(name, valid)}; "
            f"valid: {', '.join('builtin:' + v for v in valid)}"
        )
    return BUILTIN_CONFIGS[name]


def hf_weight_names(config: ModelConfig) -> list[str]:
    names = ["model.embed_tokens.weight"]
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        if config.mla:
            names += [p + "self_attn." + n for n in _mla_names(config)]
        else:
            for proj in ("q", "k", "v", "o"):
                names.append(p + f"self_attn.{proj}_proj.weight")
                if (config.qkv_bias and proj != "o") or (config.o_bias and proj == "o"):
                    names.append(p + f"self_attn.{proj}_proj.bias")
        if config.qk_norm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        if config.moe_layer(i):
            names += moe_weight_names(config, i)
            if config.router_bias:
                names.append(p + "mlp.gate.e_score_correction_bias")
            if config.shared_experts:
                names += [p + f"mlp.shared_experts.{x}_proj.weight" for x in ("gate", "up", "down")]
            continue
        for proj in ("gate", "up", "down"):
            names.append(p + f"mlp.{proj}_proj.weight")
            if config.mlp_bias:
                names.append(p + f"mlp.{proj}_proj.bias")
    names.append("model.norm.weight")
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def _mla_names(config: ModelConfig) -> list[str]:
    """Latent attention's projections under self_attn. (DeepSeek-V2-Lite has no query LoRA)."""
    q = ["q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"]
    return [
        *(q if config.q_lora_rank else ["q_proj.weight"]),
        "kv_a_proj_with_mqa.weight",
        "kv_a_layernorm.weight",
        "kv_b_proj.weight",
        "o_proj.weight",
    ]


# an MoE layer's names: (router, each expert's gate, up, down) under its module, by architecture
_MOE_NAMES = {
    "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "mixtral": ("block_sparse_moe", "w1", "w3", "w2"),
    "deepseek_v2": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "deepseek_v3": ("mlp", "gate_proj", "up_proj", "down_proj"),
}


def moe_weight_names(config: ModelConfig, layer: int) -> list[str]:
    """The router's weight, then each expert's gate, up and down weights, in expert order."""
    module, gate, up, down = _MOE_NAMES[config.arch]
    p = f"model.layers.{layer}.{module}."
    names = [p + "gate.weight"]
    for e in range(config.num_experts):
        names += [p + f"experts.{e}.{proj}.weight" for proj in (gate, up, down)]
    return names


def _shape(config: ModelConfig, name: str) -> tuple[int, ...]:
    h, d = config.hidden_size, config.head_dim
    q, kv, inter = config.num_heads * d, config.num_kv_heads * d, config.intermediate_size
    leaf = name.rsplit(".", 2)[-2:]
    module, kind = leaf[0], leaf[1]
    if ".experts." in name or ".shared_experts." in name:  # gate, up: [inter, h]; down: [h, inter]
        mi = config.moe_intermediate_size
        if ".shared_experts." in name:
            mi *= config.shared_experts
        return (h, mi) if module in ("down_proj", "w2") else (mi, h)
    if module == "gate":  # the router
        return (
            (config.num_experts,) if kind == "e_score_correction_bias" else (config.num_experts, h)
        )
    if config.mla and ".self_attn." in name:
        return _mla_shape(config, module)
    if module in ("embed_tokens", "lm_head"):
        return (config.vocab_size, h)
    if module in ("input_layernorm", "post_attention_layernorm", "norm"):
        return (h,)
    if module in ("q_norm", "k_norm"):
        return (d,)
    out_in = {
        "q_proj": (q, h),
        "k_proj": (kv, h),
        "v_proj": (kv, h),
        "o_proj": (h, q),
        "gate_proj": (inter, h),
        "up_proj": (inter, h),
        "down_proj": (h, inter),
    }[module]
    return out_in if kind == "weight" else (out_in[0],)


def _mla_shape(config: ModelConfig, module: str) -> tuple[int, ...]:
    H, h = config.num_heads, config.hidden_size
    qk = H * (config.qk_nope_head_dim + config.qk_rope_head_dim)
    kv_lora, q_lora = config.kv_lora_rank, config.q_lora_rank
    return {
        "q_proj": (qk, h),
        "q_a_proj": (q_lora, h),
        "q_a_layernorm": (q_lora,),
        "q_b_proj": (qk, q_lora),
        "kv_a_proj_with_mqa": (kv_lora + config.qk_rope_head_dim, h),
        "kv_a_layernorm": (kv_lora,),
        "kv_b_proj": (H * (config.qk_nope_head_dim + config.v_head_dim), kv_lora),
        "o_proj": (h, H * config.v_head_dim),
    }[module]


def builtin_weights(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """N(0, 1) embeddings: with N(0, 0.02) greedy decoding repeats one token, blinding the tests."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name in hf_weight_names(config):
        shape = _shape(config, name)
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            out[name] = torch.zeros(shape)
        else:  # a router (gate.weight) unit-scale too: clear winners, not near-ties
            unit = name == "model.embed_tokens.weight" or name.endswith("gate.weight")
            out[name] = torch.randn(shape, generator=gen) * (1.0 if unit else 0.02)
    return out


def _load_checkpoint(path: Path) -> ModelSource:
    if not path.exists():
        raise ModelSpecError(
            f"model {str(path)!r} is neither builtin:<name> (valid: "
            f"{', '.join('builtin:' + v for v in sorted(BUILTIN_CONFIGS))}) "
            "nor an existing directory"
        )
    if not path.is_dir():
        raise ModelSpecError(
            f"model path {str(path)!r} is not a directory (expected config.json + *.safetensors)"
        )
    config = read_config(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelSpecError(
            f"{path}: no *.safetensors files (pickled .bin checkpoints are not loaded)"
        )

    import torch
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            for k, v in load_file(str(f)).items():
                weights[k] = v.to(torch.float32)
        except Exception as exc:  # safetensors raises several types for corrupt files
            raise ModelSpecError(f"{f}: cannot read safetensors: {exc}") from None
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    expected = hf_weight_names(config)
    missing = [n for n in expected if n not in weights]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ModelSpecError(f"{path}: checkpoint lacks {', '.join(missing[:5])}{more}")
    for n in expected:
        if tuple(weights[n].shape) != _shape(config, n):
            raise ModelSpecError(
                f"{path}: {n} has shape {tuple(weights[n].shape)}, "
                f"config implies {_shape(config, n)}"
            )
    weights = {n: weights[n] for n in expected}
    return ModelSource(str(path), config, weights, _tokenizer(path, config))
