"""Model architecture presets: what planning and simulation assume about a model.

A graph's `model.arch` names one of these (or gives the three numbers inline). They describe the
production model; the weights a local deployment loads (`model.weights`) are separate, so one file
plans a 70B fleet and still deploys the built-in tiny model on a laptop.
"""

from __future__ import annotations

from dataclasses import dataclass

from pddflow.core.registry import Registry


@dataclass(frozen=True)
class ModelArch:
    name: str
    kv_bytes_per_token: int     # all layers, K and V
    flops_per_token: float      # forward FLOPs per token (about 2 x active parameters)
    weight_bytes: int           # whole model, at the serving dtype
    help: str = ""


def _dense(name: str, layers: int, kv_heads: int, head_dim: int, params_b: float,
           kv_dtype_bytes: int = 2, weight_dtype_bytes: int = 2, help: str = "") -> ModelArch:
    return ModelArch(name, 2 * layers * kv_heads * head_dim * kv_dtype_bytes,
                     2 * params_b * 1e9, int(params_b * 1e9 * weight_dtype_bytes), help)


ARCHS: Registry[ModelArch] = Registry("model architecture", "pddflow.archs")

for _a in (
    _dense("llama-3-8b", 32, 8, 128, 8.0, help="Llama-3-8B, bf16 weights and KV (128 KiB/token)"),
    _dense("llama-3-70b", 80, 8, 128, 70.6, help="Llama-3-70B, bf16 weights and KV (320 KiB/token)"),
    _dense("llama-3-70b-fp8", 80, 8, 128, 70.6, kv_dtype_bytes=1, weight_dtype_bytes=1,
           help="Llama-3-70B with fp8 weights and KV (160 KiB/token)"),
    _dense("qwen2.5-32b", 64, 8, 128, 32.8, help="Qwen2.5-32B, bf16 (256 KiB/token)"),
    # MLA caches one 512-dim latent plus a 64-dim RoPE key per layer: (512 + 64) x 61 layers x 2 B.
    ModelArch("deepseek-v3", 576 * 61 * 2, 2 * 37e9, int(671e9),
              "DeepSeek-V3/R1 (MLA, 37B active of 671B, fp8 weights): about 69 KB/token, near PDD's 50 KB working figure"),
    # The built-in model's real numbers (8 layers x 8 KV heads x 64 dims x fp32): what a laptop runs.
    ModelArch("tiny-llama", 2 * 8 * 8 * 64 * 4, 2 * 30e6, int(30e6 * 4),
              "the built-in test model (fp32 on CPU): 32 KiB/token"),
):
    ARCHS.register(_a.name, _a)
