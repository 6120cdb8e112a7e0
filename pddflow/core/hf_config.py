"""What each Hugging Face `config.json` family says, as a ModelConfig: the supported model types,
their per-architecture switches and refusals, RoPE scaling in either transformers' spelling; a
checkpoint directory's config (`read_config`) and what planning assumes of it
(`checkpoint_arch`): the graph compiler reads it here, below the engine."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from pddflow.core.arch import ModelArch
from pddflow.core.model_config import (
    BUILTIN_CONFIGS,
    MLA_MODEL_TYPES,
    MOE_MODEL_TYPES,
    SUPPORTED_MODEL_TYPES,
    ModelConfig,
    ModelSpecError,
    RopeScaling,
)


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
    """ModelSpecError naming what is not supported or missing."""
    model_type = d.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        archs = d.get("architectures")
        named = f" ({', '.join(map(str, archs))})" if isinstance(archs, list) and archs else ""
        raise ModelSpecError(
            f"model_type {model_type!r}{named} is not supported; supported: "
            + ", ".join(repr(t) for t in SUPPORTED_MODEL_TYPES)
        )
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ModelSpecError(f"hidden_act {act!r} is not supported (only 'silu')")
    if model_type in ("qwen2", "qwen3", "qwen3_moe") and d.get("use_sliding_window"):
        raise ModelSpecError(
            f"{model_type} sliding-window attention (use_sliding_window: true) is not supported"
        )
    if model_type in ("mistral", "mixtral"):
        _check_mistral_window(d)
    try:
        heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        theta, scaling = _rope_from_hf(d)
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        attention_bias = bool(d.get("attention_bias", False))
        qwen2 = model_type == "qwen2"
        layers = int(d["num_hidden_layers"])
        fields: dict[str, Any] = dict(
            arch=model_type,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            # Qwen2 always biases q/k/v, never o; the others follow `attention_bias` (all four)
            qkv_bias=True if qwen2 else attention_bias,
            o_bias=False if qwen2 else attention_bias,
            mlp_bias=bool(d.get("mlp_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", qwen2)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )
        if model_type in MOE_MODEL_TYPES:
            fields.update(_moe_from_hf(d, model_type, layers))
        if model_type in MLA_MODEL_TYPES:  # its cache geometry replaces the HF head counts
            fields.update(_deepseek_from_hf(d, model_type, layers))
        return ModelConfig(**fields)
    except KeyError as exc:
        raise ModelSpecError(f"config.json lacks required key {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ModelSpecError):
            raise
        raise ModelSpecError(f"config.json has a malformed value: {exc}") from None


def _moe_from_hf(d: dict[str, Any], model_type: str, layers: int) -> dict[str, Any]:
    """The experts of a Qwen3-MoE (its config names them num_experts; transformers 5 writes
    num_local_experts) or Mixtral config."""
    experts = int(d.get("num_local_experts") or d.get("num_experts") or 0)
    if experts < 1:
        raise ModelSpecError(f"{model_type}: config.json names no experts (num_local_experts)")
    if (
        model_type == "mixtral"
    ):  # every layer, top-k always renormalised, experts as wide as the MLP
        return dict(
            num_experts=experts,
            experts_per_token=int(d["num_experts_per_tok"]),
            moe_intermediate_size=int(d["intermediate_size"]),
            norm_topk_prob=True,
        )
    if d.get("shared_expert_intermediate_size"):
        raise ModelSpecError(f"{model_type}: shared experts are not supported")
    step = int(d.get("decoder_sparse_step") or 1)
    only_mlp = {int(i) for i in d.get("mlp_only_layers") or []}
    dense = tuple(i for i in range(layers) if i in only_mlp or (i + 1) % step)
    return dict(
        num_experts=experts,
        experts_per_token=int(d["num_experts_per_tok"]),
        moe_intermediate_size=int(d["moe_intermediate_size"]),
        norm_topk_prob=bool(d.get("norm_topk_prob", False)),
        dense_layers=dense,
    )


def _deepseek_from_hf(d: dict[str, Any], model_type: str, layers: int) -> dict[str, Any]:
    """DeepSeek-V2/V3: latent attention (its cache geometry as the one KV head, see ModelConfig)
    and the mixture: routed and shared experts after the first `first_k_dense_replace` dense
    layers, V2's softmax routing or V3's biased sigmoid, as transformers computes them."""
    if d.get("attention_bias"):
        raise ModelSpecError(f"{model_type}: attention_bias: true is not supported")
    if int(d.get("moe_layer_freq") or 1) != 1:
        raise ModelSpecError(
            f"{model_type}: moe_layer_freq {d['moe_layer_freq']} is not supported (only 1: every "
            "layer after first_k_dense_replace is a mixture, as transformers builds it)"
        )
    kv_lora, rope = int(d["kv_lora_rank"]), int(d["qk_rope_head_dim"])
    experts = int(d.get("n_routed_experts") or 0)
    if experts < 1:
        raise ModelSpecError(f"{model_type}: config.json names no experts (n_routed_experts)")
    if model_type == "deepseek_v2":
        method = str(d.get("topk_method") or "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise ModelSpecError(
                f"deepseek_v2: topk_method {method!r} is not supported; supported: 'greedy', "
                "'group_limited_greedy'"
            )
        if d.get("norm_topk_prob"):
            # DeepSeek's own code renormalises then, transformers never does: no one answer
            raise ModelSpecError("deepseek_v2: norm_topk_prob: true is not supported")
        router, norm, bias = ("softmax" if method == "greedy" else method), False, False
    else:
        method = str(d.get("topk_method") or "noaux_tc")
        scoring = str(d.get("scoring_func") or "sigmoid")
        if method != "noaux_tc" or scoring != "sigmoid":
            raise ModelSpecError(
                f"deepseek_v3: topk_method {method!r} with scoring_func {scoring!r} is not "
                "supported (only 'noaux_tc' with 'sigmoid')"
            )
        router, norm, bias = "noaux_tc", bool(d.get("norm_topk_prob", True)), True
    groups = int(d.get("n_group") or 1)
    if experts % groups:
        raise ModelSpecError(f"{model_type}: {experts} experts do not split into {groups} groups")
    return dict(
        num_kv_heads=1,
        head_dim=kv_lora + rope,
        kv_lora_rank=kv_lora,
        q_lora_rank=int(d.get("q_lora_rank") or 0),
        qk_nope_head_dim=int(d["qk_nope_head_dim"]),
        qk_rope_head_dim=rope,
        v_head_dim=int(d["v_head_dim"]),
        rope_interleave=bool(d.get("rope_interleave", True)),
        num_experts=experts,
        experts_per_token=int(d["num_experts_per_tok"]),
        moe_intermediate_size=int(d["moe_intermediate_size"]),
        norm_topk_prob=norm,
        dense_layers=tuple(range(min(int(d.get("first_k_dense_replace") or 0), layers))),
        shared_experts=int(d.get("n_shared_experts") or 0),
        router=router,
        router_groups=groups,
        router_topk_groups=int(d.get("topk_group") or 1),
        routed_scaling_factor=float(d.get("routed_scaling_factor") or 1.0),
        router_bias=bias,
    )


def _check_mistral_window(d: dict[str, Any]) -> None:
    """Attention here is full causal: a window is harmless only when no sequence can exceed it."""
    window = d.get("sliding_window")
    if window is None:
        return
    max_pos = int(d.get("max_position_embeddings", 4096))
    if int(window) < max_pos:
        raise ModelSpecError(
            f"Mistral sliding_window {window} is smaller than max_position_embeddings {max_pos}: "
            "sliding-window attention is not supported (set sliding_window to null, or "
            f"max_position_embeddings to at most {window}, in config.json)"
        )


def _rope_from_hf(d: dict[str, Any]) -> tuple[float, RopeScaling]:
    # transformers 5 writes `rope_parameters` (theta inside); 4.x `rope_theta` + `rope_scaling`.
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ModelSpecError("partial_rotary_factor != 1 is not supported")
    if rope_type == "default":
        return theta, RopeScaling()
    if rope_type == "linear":
        return theta, RopeScaling("linear", factor=float(params["factor"]))
    if rope_type == "llama3":
        return theta, RopeScaling(
            "llama3",
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    if rope_type == "yarn":
        factor = params.get("factor")
        original = int(params["original_max_position_embeddings"])
        if factor is None:  # transformers: the ratio of the extended to the pretrained context
            factor = int(d.get("max_position_embeddings", 4096)) / original
        return theta, RopeScaling(
            "yarn",
            factor=float(factor),
            original_max_position_embeddings=original,
            beta_fast=float(params.get("beta_fast") or 32),
            beta_slow=float(params.get("beta_slow") or 1),
            mscale=float(params.get("mscale") or 0),
            mscale_all_dim=float(params.get("mscale_all_dim") or 0),
            attention_factor=float(params.get("attention_factor") or 0),
            truncate=bool(params.get("truncate", True)),
        )
    raise ModelSpecError(
        f"RoPE type {rope_type!r} is not supported; supported: default, linear, llama3, yarn"
    )


def _read_json(file: Path) -> dict:
    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelSpecError(f"{file}: cannot parse: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelSpecError(f"{file}: expected a JSON object")
    return raw


def read_config(path: Path) -> ModelConfig:
    """A checkpoint directory's config.json; EOS IDs also from generation_config.json, which is
    where instruct checkpoints list their end-of-turn token (and what transformers stops at)."""
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelSpecError(f"{path}: no config.json")
    config = config_from_hf(_read_json(cfg_file))
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        eos = _read_json(gen_file).get("eos_token_id")
        extra = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        merged = tuple(dict.fromkeys([*config.eos_token_ids, *(int(e) for e in extra)]))
        config = replace(config, eos_token_ids=merged)
    return config


# config.json's dtype (transformers 5) or torch_dtype -> bytes a value is served at
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}


def checkpoint_arch(spec: str) -> ModelArch:
    """What planning assumes of the model `spec` names (`builtin:<name>`, a checkpoint directory,
    or a Hub id already in the Hub cache: nothing is downloaded), from its config.json and the
    dtype it was saved in (bf16 when it does not say). ModelSpecError when there is none."""
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN_CONFIGS:
            raise ModelSpecError(f"unknown builtin model {name!r}")
        return BUILTIN_CONFIGS[name].planning_arch(spec, dtype_bytes=4)  # fp32, as it is served
    path = Path(spec) / "config.json"
    if not path.is_file():
        from pddflow.core.model_ref import is_hub_id

        cached = _cached_hub_config(spec) if is_hub_id(spec) else None
        if cached is None:
            raise ModelSpecError(
                f"no config.json for {spec!r} here (a checkpoint directory, or a Hub id already "
                "downloaded); download it first, or name an arch preset"
            )
        path = cached
    raw = _read_json(path)  # read once: the dtype and the config (its EOS IDs plan nothing)
    dtype = str(raw.get("dtype") or raw.get("torch_dtype") or "bfloat16")
    return config_from_hf(raw).planning_arch(
        f"checkpoint:{spec}", dtype_bytes=_DTYPE_BYTES.get(dtype, 2)
    )


def _cached_hub_config(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a dependency
        return None
    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found) if isinstance(found, str) else None
