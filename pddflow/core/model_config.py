"""Model configuration, pure Python: what the engine computes with, for Llama, Mistral, Qwen2,
Qwen3, the mixtures of experts Qwen3-MoE and Mixtral, and DeepSeek-V2/V3 with latent attention
(read from an HF config.json by core.hf_config, which refuses what the engine does not implement:
never silently computed wrong), the built-in models, and what planning assumes of a model."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pddflow.core.arch import ModelArch


class ModelSpecError(ValueError):
    pass


# HF `model_type` -> the architecture the engine runs it as; all are the Llama decoder with
# per-architecture switches (biases, q/k norms, a mixture of experts for the MLP, latent attention),
# see `ModelConfig.from_hf`.
SUPPORTED_MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "mixtral",
    "deepseek_v2",
    "deepseek_v3",
)
MOE_MODEL_TYPES = ("qwen3_moe", "mixtral")
MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
# how a router picks its experts: softmax top-k (Qwen3-MoE, Mixtral, DeepSeek-V2 `greedy`); the
# softmax's best experts within the `topk_group` groups of highest maximum (DeepSeek-V2
# `group_limited_greedy`); sigmoid scores plus a correction bias, groups ranked by their two best
# (DeepSeek-V3 `noaux_tc`)
ROUTERS = ("softmax", "group_limited_greedy", "noaux_tc")


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "default"  # default | linear | llama3 | yarn
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 and yarn
    beta_fast: float = 32.0  # yarn only, and below
    beta_slow: float = 1.0
    mscale: float = 0.0  # 0: not given
    mscale_all_dim: float = 0.0
    attention_factor: float = 0.0  # 0: from factor, mscale and mscale_all_dim
    truncate: bool = True

    def yarn_attention_factor(self) -> float:
        """What YaRN multiplies cos and sin by (as transformers computes it)."""
        if self.attention_factor:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(
                self.factor, self.mscale_all_dim
            )
        return yarn_mscale(self.factor)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


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
    # DeepSeek's mixture: `shared_experts` x moe_intermediate_size of one MLP every token takes;
    # the router (ROUTERS) over `router_groups` groups of which `router_topk_groups` are kept; the
    # chosen weights times `routed_scaling_factor`; `router_bias`: e_score_correction_bias
    shared_experts: int = 0
    router: str = "softmax"
    router_groups: int = 1
    router_topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    router_bias: bool = False
    # multi-head latent attention (DeepSeek-V2/V3), when kv_lora_rank > 0: the KV cache holds one
    # latent of kv_lora_rank and one shared RoPE key of qk_rope_head_dim per token and layer.
    # Attention runs in the absorbed form, where that latent is the one KV head every query head
    # reads: num_kv_heads is 1 and head_dim kv_lora_rank + qk_rope_head_dim, the cache's geometry.
    # q_lora_rank 0: the query straight from q_proj. rope_interleave: RoPE on adjacent pairs.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False

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
        if self.router not in ROUTERS:
            raise ModelSpecError(f"router {self.router!r} is not one of {', '.join(ROUTERS)}")
        if self.router != "softmax" and not (
            0 < self.router_topk_groups <= self.router_groups
            and self.num_experts % self.router_groups == 0
            and self.experts_per_token
            <= self.router_topk_groups * self.num_experts // self.router_groups
        ):
            raise ModelSpecError(
                f"topk_group ({self.router_topk_groups}) of n_group ({self.router_groups}) "
                f"cannot hold {self.experts_per_token} of {self.num_experts} experts"
            )
        if self.mla and (
            self.num_kv_heads != 1 or self.head_dim != self.kv_lora_rank + self.qk_rope_head_dim
        ):
            raise ModelSpecError("latent attention keeps one KV head of kv_lora_rank + rope dims")
        if self.mla and self.qk_rope_head_dim % 2:
            raise ModelSpecError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be even")

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def kv_planes(self) -> int:
        """Planes a KV block holds per layer: K and V, or MLA's one latent (+ RoPE key)."""
        return 1 if self.mla else 2

    @property
    def value_dim(self) -> int:
        """Width of what attention averages per KV head: V, or MLA's latent (the plane's first
        kv_lora_rank values)."""
        return self.kv_lora_rank if self.mla else self.head_dim

    @property
    def rope_dim(self) -> int:
        return self.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def softmax_scale(self) -> float:
        """MLA scales by the uncompressed query-key width, and YaRN's mscale_all_dim squared."""
        if not self.mla:
            return self.head_dim**-0.5
        scale = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        rs = self.rope_scaling
        if rs.rope_type == "yarn" and rs.mscale_all_dim:
            scale *= yarn_mscale(rs.factor, rs.mscale_all_dim) ** 2
        return scale

    def moe_layer(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is the mixture of experts."""
        return self.num_experts > 0 and layer not in self.dense_layers

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        return self.num_layers * self.kv_planes * self.num_kv_heads * self.head_dim * dtype_bytes

    def _attention_params(self) -> int:
        h, H = self.hidden_size, self.num_heads
        if not self.mla:
            kv, q = self.num_kv_heads * self.head_dim, H * self.head_dim
            return h * (q + 2 * kv) + q * h + (2 * self.head_dim if self.qk_norm else 0)
        qk = H * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        r = self.q_lora_rank
        q = (h * r + r + r * qk) if r else h * qk
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv += self.kv_lora_rank * H * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + H * self.v_head_dim * h

    def num_params(self, active: bool = False) -> int:
        """Every parameter; `active`: those one token computes with (its experts only)."""
        h = self.hidden_size
        per_layer = self._attention_params() + 2 * h
        experts = self.experts_per_token if active else self.num_experts
        moe = (experts + self.shared_experts) * 3 * h * self.moe_intermediate_size
        moe += self.num_experts * (h + (1 if self.router_bias else 0))  # the router
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
            attn_flops_per_pair=self._attention_flops_per_pair(),
            decode_attn_flops_per_pair=self._attention_flops_per_pair(decode=True),
        )

    def _attention_flops_per_pair(self, decode: bool = False) -> float:
        """2 x (query-key width + value width) per query head and layer; MLA counted in its
        uncompressed form (what prefill computes), or for `decode` in the absorbed form over the
        latent (latent + RoPE key, latent value), as the presets count DeepSeek-V3."""
        if self.mla and decode:
            widths = 2 * self.kv_lora_rank + self.qk_rope_head_dim
        elif self.mla:
            widths = self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim
        else:
            widths = 2 * self.head_dim
        return 2.0 * self.num_layers * self.num_heads * widths


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
