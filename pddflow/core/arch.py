"""Architectures that planning and simulation assume, apart from the weights a deployment loads."""

from __future__ import annotations

from dataclasses import dataclass

from pddflow.core.registry import Registry


@dataclass(frozen=True)
class ModelArch:
    name: str
    kv_bytes_per_token: int  # all layers, K and V
    flops_per_token: float  # forward FLOPs per token (about 2 x active parameters)
    weight_bytes: int  # whole model, at the serving dtype
    help: str = ""
    # all layers, 4 x layers x q heads x head_dim; 0: 8 x kv_bytes_per_token (16-bit KV, GQA 8)
    attn_flops_per_pair: float = 0.0
    # a decoding query's pair where it differs: MLA decodes in the absorbed form, each head
    # attending over the 576-wide latent key and 512-wide latent value (FlashMLA's count), where
    # prefill computes the uncompressed 192 + 128; 0: attention_flops_per_pair
    decode_attn_flops_per_pair: float = 0.0
    # attention's cost a FLOP against the matmuls' at the device class's peak (which is at the
    # serving dtype): 2.0 where attention runs in bf16 beside fp8 matmuls, as MLA's kernels do
    attn_dtype_factor: float = 1.0

    @property
    def attention_flops_per_pair(self) -> float:
        return self.attn_flops_per_pair or 8.0 * self.kv_bytes_per_token

    @property
    def decode_attention_flops_per_pair(self) -> float:
        return self.decode_attn_flops_per_pair or self.attention_flops_per_pair


def _dense(
    name: str,
    layers: int,
    kv_heads: int,
    head_dim: int,
    params_b: float,
    q_heads: int,
    kv_dtype_bytes: int = 2,
    weight_dtype_bytes: int = 2,
    help: str = "",
) -> ModelArch:
    return ModelArch(
        name,
        2 * layers * kv_heads * head_dim * kv_dtype_bytes,
        2 * params_b * 1e9,
        int(params_b * 1e9 * weight_dtype_bytes),
        help,
        attn_flops_per_pair=4.0 * layers * q_heads * head_dim,
    )


ARCHS: Registry[ModelArch] = Registry("model architecture", "pddflow.archs")
# model.arch that reads the numbers from model.weights' config.json (operators.weights)
FROM_CHECKPOINT = "checkpoint"

for _a in (
    _dense(
        "llama-3-8b", 32, 8, 128, 8.0, 32, help="Llama-3-8B, bf16 weights and KV (128 KiB/token)"
    ),
    _dense(
        "llama-3-70b", 80, 8, 128, 70.6, 64, help="Llama-3-70B, bf16 weights and KV (320 KiB/token)"
    ),
    _dense(
        "llama-3-70b-fp8",
        80,
        8,
        128,
        70.6,
        64,
        kv_dtype_bytes=1,
        weight_dtype_bytes=1,
        help="Llama-3-70B with fp8 weights and KV (160 KiB/token)",
    ),
    _dense("qwen2.5-32b", 64, 8, 128, 32.8, 40, help="Qwen2.5-32B, bf16 (256 KiB/token)"),
    # MLA: (512 latent + 64 RoPE key dims) x 61 layers x 2 B; attention: 128 heads, QK 192 + PV 128
    # (prefill), QK 576 + PV 512 over the latent (decode), in bf16 beside the fp8 matmuls
    ModelArch(
        "deepseek-v3",
        576 * 61 * 2,
        2 * 37e9,
        int(671e9),
        "DeepSeek-V3/R1 (MLA, 37B active of 671B, fp8 weights): about 69 KB/token, "
        "near PDD's 50 KB working figure",
        attn_flops_per_pair=2.0 * 61 * 128 * (192 + 128),
        decode_attn_flops_per_pair=2.0 * 61 * 128 * (576 + 512),
        attn_dtype_factor=2.0,
    ),
    # MoE, GQA: 94 layers x 4 KV heads x 128 x 2 (K, V) x 2 B; 22B active of 235B, bf16
    ModelArch(
        "qwen3-235b-a22b",
        94 * 4 * 128 * 2 * 2,
        2 * 22e9,
        int(235e9 * 2),
        "Qwen3-235B-A22B (MoE: 8 of 128 experts, GQA 64/4, bf16): 188 KiB/token",
        attn_flops_per_pair=4.0 * 94 * 64 * 128,
    ),
    # DeepSeek-V3's MLA with 64 heads: (512 + 64) x 61 layers x 2 B; 32B active of 1.04T, fp8
    ModelArch(
        "kimi-k2",
        576 * 61 * 2,
        2 * 32e9,
        int(1.04e12),
        "Kimi-K2 (DeepSeek-V3 architecture with 64 heads and 384 experts, fp8 weights): "
        "about 69 KB/token",
        attn_flops_per_pair=2.0 * 61 * 64 * (192 + 128),
        decode_attn_flops_per_pair=2.0 * 61 * 64 * (576 + 512),
        attn_dtype_factor=2.0,
    ),
    # The built-in model (core.model_config.TINY_LLAMA; tests/sim check the numbers match).
    _dense(
        "tiny-llama",
        16,
        4,
        64,
        0.047468032,
        8,
        kv_dtype_bytes=4,
        weight_dtype_bytes=4,
        help="the built-in test model (fp32 on CPU): 32 KiB/token",
    ),
):
    ARCHS.register(_a.name, _a)
