"""The device model's attention terms for latent attention (docs/simulator.md, Held to published
figures): a decoding query is priced in MLA's absorbed form, attention in bf16 beside fp8
matmuls, and every GQA model costs what it did."""

from __future__ import annotations

import pytest

from pddflow.core.arch import ARCHS
from pddflow.core.device import DeviceClass
from pddflow.core.device_model import DeviceModel
from pddflow.core.model_config import ModelConfig

H800 = DeviceClass("h800", 1979, 80, 3.35, 400, 2.0)  # fp8 dense peak
PEAK = 1979e12 * 0.5  # default MFU
# FlashMLA's count: 2 x heads x (576 + 512) a (query, key) pair and layer, 61 layers, 128 heads
ABSORBED = 2.0 * 61 * 128 * (576 + 512)
UNCOMPRESSED = 2.0 * 61 * 128 * (192 + 128)


def test_an_mla_decode_step_is_priced_absorbed_in_bf16():
    """DeepSeek's decode unit (144 H800s, 88 sequences of 4,989 tokens each): attention over the
    latent at half the fp8 peak makes the step compute-bound at 22.7 ms. The uncompressed count at
    the fp8 peak gave a memory-bound 14.3 ms, its attention at 3,364 TFLOPS on FlashMLA's count
    (FlashMLA reaches 660)."""
    m = DeviceModel(H800, 144, ARCHS.get("deepseek-v3"))
    b, ctx = 144 * 88, 4989
    want = (b * 74e9 + b * ctx * 2 * ABSORBED) / (144 * PEAK) + 0.001
    assert m.decode_step_s(b, b * ctx) == pytest.approx(want, rel=1e-12)
    assert m.decode_step_s(b, b * ctx) == pytest.approx(0.02266, abs=1e-5)
    one = DeviceModel(H800, 1, ARCHS.get("deepseek-v3"))
    assert one.flops_s * ABSORBED / one.decode_attn_flops_per_pair / 1e12 == pytest.approx(494.75)


def test_an_mla_prefill_keeps_the_uncompressed_form():
    """Prefill computes the 192 + 128 wide heads (in bf16); a mixed step prices only its decode
    rows absorbed."""
    m = DeviceModel(H800, 32, ARCHS.get("deepseek-v3"))
    n, cached = 8192, 4096
    pairs = n * cached + n * n / 2
    assert m.chunk_s(n, cached) == pytest.approx(
        (n * 74e9 + pairs * 2 * UNCOMPRESSED) / (32 * PEAK) + 0.001, rel=1e-12
    )
    b, c = 16, 16 * 3000
    mixed = m.step_s(b + n, c + pairs, c + cached + n, b, c)
    assert mixed == pytest.approx(
        ((b + n) * 74e9 + pairs * 2 * UNCOMPRESSED + c * 2 * ABSORBED) / (32 * PEAK) + 0.001,
        rel=1e-12,
    )


@pytest.mark.parametrize("arch", ["llama-3-70b-fp8", "qwen3-235b-a22b", "tiny-llama"])
def test_gqa_decode_costs_what_it_did(arch):
    """No decode term of its own: the same FLOPs a pair as prefill, exactly."""
    m = DeviceModel(H800, 4, ARCHS.get(arch))
    assert m.decode_attn_flops_per_pair == m.attn_flops_per_pair
    assert m.attn_flops_per_pair == ARCHS.get(arch).attention_flops_per_pair
    assert m.decode_step_s(37, 37 * 1234.0) == m.step_s(37, 37 * 1234.0, 37 * 1234.0, 37)


def test_planning_from_an_mla_config_gives_the_presets_decode_count():
    """A checkpoint's config.json with DeepSeek-V3's attention (arch: checkpoint) plans decode in
    the absorbed form too; served at one dtype, its attention is not priced at a second."""
    config = ModelConfig(
        arch="deepseek_v3",
        vocab_size=129280,
        hidden_size=7168,
        intermediate_size=18432,
        num_layers=61,
        num_heads=128,
        num_kv_heads=1,
        head_dim=576,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
    )
    planned, preset = config.planning_arch("checkpoint"), ARCHS.get("deepseek-v3")
    assert planned.decode_attention_flops_per_pair == preset.decode_attention_flops_per_pair
    assert planned.decode_attention_flops_per_pair == ABSORBED
    assert planned.attention_flops_per_pair == preset.attention_flops_per_pair == UNCOMPRESSED
    assert planned.attn_dtype_factor == 1.0 and preset.attn_dtype_factor == 2.0
