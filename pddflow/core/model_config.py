"""Model configuration from an HF `config.json` (Llama, Mistral, Qwen2, Qwen3, and the
mixture-of-experts Qwen3-MoE and Mixtral) or builtin, pure Python; what the engine does not
implement is refused, never silently computed wrong. Also what planning assumes of a checkpoint
(`checkpoint_arch`): the graph compiler reads it here, below the engine."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pddflow.core.arch import ModelArch


class ModelSpecError(ValueError):
    pass


# HF `model_type` -> the architecture the engine runs it as; all are the Llama decoder with
# per-architecture switches (biases, q/k norms, a mixture of experts for the MLP), see
# `ModelConfig.from_hf`.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral")
MOE_MODEL_TYPES = ("qwen3_moe", "mixtral")


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # one of SUPPORTED_MODEL_TYPES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 4096
    qkv_bias: bool = False  # Qwen2 always; Llama when attention_bias
    o_bias: bool = False  # Llama attention_bias covers o_proj too; Qwen2 never
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k before RoPE
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # mixture of experts (Qwen3-MoE, Mixtral): each MoE layer's MLP is `num_experts` experts of
    # `moe_intermediate_size`, `experts_per_token` of them per token by the router's softmax top-k
    # (renormalised over the chosen when norm_topk_prob); `dense_layers` keep the dense MLP
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    dense_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ModelSpecError(
                f"num_attention_heads ({self.num_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise ModelSpecError(
                f"num_experts_per_tok ({self.experts_per_token}) must be in 1..num_experts "
                f"({self.num_experts})"
            )

    def moe_layer(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is the mixture of experts."""
        return self.num_experts > 0 and layer not in self.dense_layers

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * dtype_bytes

    def num_params(self, active: bool = False) -> int:
        """Every parameter; `active`: those one token computes with (its experts only)."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        q = self.num_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 2 * h
        per_layer += 2 * self.head_dim if self.qk_norm else 0
        experts = self.experts_per_token if active else self.num_experts
        moe = experts * 3 * h * self.moe_intermediate_size + self.num_experts * h
        mlps = sum(
            moe if self.moe_layer(i) else 3 * h * self.intermediate_size
            for i in range(self.num_layers)
        )
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + mlps + emb + h

    def planning_arch(self, name: str, dtype_bytes: int = 2) -> ModelArch:
        """What `plan`, `simulate` and `size` assume of this model served at `dtype_bytes` a
        value (weights and KV): its KV bytes per token, 2 x its active parameters of FLOPs per
        token, its weights' bytes, attention's FLOPs per (query, key) pair."""
        return ModelArch(
            name,
            self.kv_bytes_per_token(dtype_bytes),
            2.0 * self.num_params(active=True),
            self.num_params() * dtype_bytes,
            f"{self.arch} from its checkpoint's config.json, {dtype_bytes}-byte values",
            attn_flops_per_pair=4.0 * self.num_layers * self.num_heads * self.head_dim,
        )

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> ModelConfig:
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
            return cls(
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
                **(_moe_from_hf(d, model_type, layers) if model_type in MOE_MODEL_TYPES else {}),
            )
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
    raise ModelSpecError(
        f"RoPE type {rope_type!r} is not supported; supported: default, linear, llama3"
    )


# 32 KiB of fp32 KV per token (inside PDD's 10-80 KB range), GQA and llama3 RoPE: every code path
# of a real Llama 3 at 47M parameters. Vocabulary: 256 bytes + <bos> <eos> <pad>.
TINY_LLAMA = ModelConfig(
    arch="llama",
    vocab_size=259,
    hidden_size=512,
    intermediate_size=1408,
    num_layers=16,
    num_heads=8,
    num_kv_heads=4,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling=RopeScaling(
        "llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=2048,
    ),
    max_position_embeddings=16384,
    bos_token_id=256,
    eos_token_ids=(257,),
)

# the built-in models (`builtin:<name>`) and their configs
BUILTIN_CONFIGS: dict[str, ModelConfig] = {"tiny-llama": TINY_LLAMA}


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
    config = ModelConfig.from_hf(_read_json(cfg_file))
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
    return ModelConfig.from_hf(raw).planning_arch(
        f"checkpoint:{spec}", dtype_bytes=_DTYPE_BYTES.get(dtype, 2)
    )


def _cached_hub_config(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a dependency
        return None
    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found) if isinstance(found, str) else None
