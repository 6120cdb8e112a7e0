"""The device model held to published figures: DeepSeek's V3/R1 prefill and decode nodes, and the
FlashMLA decode kernel, built in `pddflow.core.device_model` and printed beside what was published.

Published (in words): DeepSeek's "Day 6" open-source-week post (DeepSeek-V3/R1 Inference System
Overview, March 2025) reports, for H800 nodes of 8 GPUs with FP8 matmuls and BF16 MLA attention,
a day's average of about 73.7k input tokens/s per node during prefill, cache hits included (56.3%
of the day's input tokens hit the cache), with routed experts EP32 and MLA / shared expert DP32
over 4 nodes, and about 14.8k output tokens/s per node during decode, EP144 / DP144 over 18 nodes,
at an average KV length of 4,989 tokens per output token and 20-22 output tokens/s per user. The
FlashMLA README (deepseek-ai/FlashMLA) reports its BF16 decode kernel at up to 3,000 GB/s in a
memory-bound configuration and 660 TFLOPS in a compute-bound one on H800 SXM5.

    python benchmarks/published_nodes.py [--decode-batch 88] [--prompt 4383] [--json]

Ours: the `deepseek-v3` preset (fp8 weights, 16-bit latent KV) on an H800-like device class
(the numbers of the shipped graphs' gpu_a: 1,979 dense FP8 TFLOPS, 80 GiB, 3.35 TB/s) with the
default efficiencies; a replica is the deployment unit (32 or 144 devices: the model sums their
FLOP/s and bandwidth and reads the weights once a step across them). Assumptions, from the
published figures: decode concurrency 14.8k / 21 tokens/s per user = 705 sequences a node, 88 a
GPU; the prompt length from the day's 608B input / 168B output tokens with 4,989 the mean KV
length per output token (prompt + half the output: 4,383 in, 1,211 out). Each row is printed
with ours / published; the terms of each step follow, and side estimates of what the model does
not price (DP attention's replicated weights, EP all-to-all bytes), for docs/simulator.md.
Run with PYTHONPATH at another tree to price the same nodes with its model.
"""

from __future__ import annotations

import argparse
import json

from pddflow.core.arch import ARCHS
from pddflow.core.device import DeviceClass
from pddflow.core.device_model import DeviceModel

# the shipped graphs' gpu_a (graphs/sim/pdd_88.yaml): H800, dense peak at the serving dtype (fp8)
H800 = DeviceClass("h800", tflops=1979, hbm_gib=80, hbm_tbps=3.35, net_gbps=400, usd_per_hour=2.0)
GPUS_PER_NODE = 8
PUBLISHED = {"prefill_tok_s_node": 73.7e3, "decode_tok_s_node": 14.8e3}
FLASHMLA = {"gb_s": 3000.0, "tflops": 660.0}  # H800 SXM5, BF16
CACHE_HIT = 0.563
KV_LEN = 4989
USER_TOK_S = 21.0  # "20-22 tokens/s"
# DeepSeek-V3's config.json: the shapes the side estimates need
HIDDEN, MOE_INTER, LAYERS, MOE_LAYERS, EXPERTS, TOP_K = 7168, 2048, 61, 58, 256, 8
HEADS, LATENT, ROPE = 128, 512, 64
EXPERT_PARAMS = 3 * HIDDEN * MOE_INTER
IB_GB_S = 50.0  # 400 Gb/s a GPU


def _decode_per_pair(m: DeviceModel) -> float:
    """The model's FLOP-equivalents per decode (query, key) pair (a tree without the decode
    term prices decode pairs as prefill's)."""
    return getattr(m, "decode_attn_flops_per_pair", m.attn_flops_per_pair)


def _terms(m: DeviceModel, new: float, pairs: float, decode_pairs: float, kv: float) -> dict:
    per_dec = _decode_per_pair(m)
    compute = new * m.flops_per_token + pairs * m.attn_flops_per_pair + decode_pairs * per_dec
    memory = m.weight_bytes + kv * m.kv_read_bytes_per_token
    c, b = compute / m.flops_s, memory / m.bytes_s
    return {
        "compute_ms": round(c * 1e3, 2),
        "memory_ms": round(b * 1e3, 2),
        "overhead_ms": round(m.step_overhead_s * 1e3, 2),
        "bound": "compute" if c > b else "memory",
    }


def prefill(a: argparse.Namespace) -> dict:
    arch, devices = ARCHS.get("deepseek-v3"), 32
    m = DeviceModel(H800, devices, arch)
    cached = round(a.prompt * CACHE_HIT)
    new = a.prompt - cached
    n = a.prefill_prompts_per_gpu * devices
    pairs = n * (new * cached + new * new / 2)
    step = m.step_s(n * new, pairs, n * a.prompt) + m.prefill_overhead_s
    per_node = n * a.prompt / step / (devices / GPUS_PER_NODE)
    # what the published rate implies: FLOP-equivalents per computed token at the model's terms
    per_token = arch.flops_per_token + (cached + new / 2) * (m.attn_flops_per_pair)
    published_computed = PUBLISHED["prefill_tok_s_node"] * (1 - CACHE_HIT) / GPUS_PER_NODE
    # EP32 over 4 nodes, node-limited routing (4 nodes a token at most, its own included): at most
    # 3 remote nodes a token, the hidden state once a node (fp8 out, bf16 back) a MoE layer
    ib_bytes_token = 3 * HIDDEN * (1 + 2) * MOE_LAYERS
    ours_computed = per_node * (1 - CACHE_HIT) / GPUS_PER_NODE
    # the same prompts with no hit: every input token computed
    cold = m.step_s(n * a.prompt, n * a.prompt**2 / 2, n * a.prompt) + m.prefill_overhead_s
    return {
        "devices": devices,
        "prompt": a.prompt,
        "cached": cached,
        "prompts_per_step": n,
        "step_ms": round(step * 1e3, 1),
        "terms": _terms(m, n * new, pairs, 0.0, n * a.prompt),
        "ours_tok_s_node": per_node,
        "computed_tok_s_gpu": {
            "ours": round(ours_computed),
            "published": round(published_computed),
        },
        "implied_mfu": round(published_computed * per_token / (H800.tflops * 1e12), 3),
        "no_hit_tok_s_node": round(n * a.prompt / cold / (devices / GPUS_PER_NODE)),
        "ep_ib_gb_s_gpu": {
            "ours": round(ours_computed * ib_bytes_token / 1e9, 1),
            "published": round(published_computed * ib_bytes_token / 1e9, 1),
            "limit": IB_GB_S,
        },
    }


def decode(a: argparse.Namespace) -> dict:
    arch, devices = ARCHS.get("deepseek-v3"), 144
    m = DeviceModel(H800, devices, arch)
    batch = a.decode_batch * devices
    step = m.decode_step_s(batch, batch * KV_LEN)
    per_node = batch / step / (devices / GPUS_PER_NODE)
    routed = MOE_LAYERS * EXPERTS * EXPERT_PARAMS  # fp8: a byte a parameter
    replicated = arch.weight_bytes - routed  # attention, shared experts, dense layers, embeddings
    per_gpu_weights = replicated + (EXPERTS + 32) // devices * MOE_LAYERS * EXPERT_PARAMS
    # EP144 low-latency all-to-all: each token to its 8 experts (fp8 out, bf16 back) a MoE layer,
    # 136 of 144 ranks remote
    a2a = a.decode_batch * TOP_K * HIDDEN * (1 + 2) * MOE_LAYERS * (devices - 8) / devices
    terms = _terms(m, batch, 0.0, batch * KV_LEN, batch * KV_LEN)
    published_ms = a.decode_batch / (PUBLISHED["decode_tok_s_node"] / GPUS_PER_NODE) * 1e3
    return {
        "devices": devices,
        "batch_per_gpu": a.decode_batch,
        "kv_len": KV_LEN,
        "step_ms": round(step * 1e3, 2),
        "published_step_ms": round(published_ms, 1),
        "terms": terms,
        # the MFU at which the compute term fills the published step (less the fixed cost)
        "implied_mfu": round(0.5 * terms["compute_ms"] / (published_ms - terms["overhead_ms"]), 3),
        "ours_tok_s_node": per_node,
        "weights_read_gb_gpu": {
            "ours": round(arch.weight_bytes / devices / 1e9, 2),
            "dp_attention": round(per_gpu_weights / 1e9, 2),
        },
        "ep_a2a_gb_gpu_step": round(a2a / 1e9, 3),
        "ep_a2a_ms_step": round(a2a / (IB_GB_S * 1e9) * 1e3, 1),
        "kv_gb_gpu": round(a.decode_batch * KV_LEN * arch.kv_bytes_per_token / 1e9, 1),
    }


def mla_kernel(a: argparse.Namespace) -> dict:
    """The decode attention on one GPU: the rates the model implies, and the time it gives the
    decode node's attention against FlashMLA's two published bounds."""
    arch = ARCHS.get("deepseek-v3")
    m = DeviceModel(H800, 1, arch)
    # FlashMLA counts 2 x heads x (576 + 512) FLOPs a (query, key) pair and layer (absorbed form)
    flashmla_flops = 2.0 * LAYERS * HEADS * (LATENT + ROPE + LATENT)
    ours_gb_s = m.bytes_s / 1e9  # a KV byte read at the model's bandwidth
    ours_tflops = m.flops_s * flashmla_flops / _decode_per_pair(m) / 1e12
    pairs = a.decode_batch * KV_LEN
    kv_bytes = pairs * arch.kv_bytes_per_token
    ours_s = max(pairs * _decode_per_pair(m) / m.flops_s, kv_bytes / m.bytes_s)
    theirs_s = max(kv_bytes / (FLASHMLA["gb_s"] * 1e9), pairs * flashmla_flops / 660e12)
    return {
        "ours_gb_s": ours_gb_s,
        "ours_tflops": ours_tflops,
        "decode_shape_ms": {"ours": round(ours_s * 1e3, 2), "flashmla": round(theirs_s * 1e3, 2)},
        "decode_shape_gb_s": {
            "ours": kv_bytes / ours_s / 1e9,
            "flashmla": kv_bytes / theirs_s / 1e9,
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--decode-batch", type=int, default=88, help="sequences a decode GPU")
    p.add_argument("--prompt", type=int, default=4383, help="prompt tokens, cache hits included")
    p.add_argument("--prefill-prompts-per-gpu", type=int, default=4, help="prompts a prefill step")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    pf, dc, k = prefill(a), decode(a), mla_kernel(a)
    rows = [
        ("prefill input tok/s per node (hits incl.)", pf["ours_tok_s_node"], 73.7e3),
        ("decode output tok/s per node", dc["ours_tok_s_node"], 14.8e3),
        ("MLA decode, memory-bound GB/s", k["ours_gb_s"], FLASHMLA["gb_s"]),
        ("MLA decode, compute-bound TFLOPS", k["ours_tflops"], FLASHMLA["tflops"]),
        (
            f"MLA decode at {a.decode_batch} x {KV_LEN}, KV GB/s",
            k["decode_shape_gb_s"]["ours"],
            k["decode_shape_gb_s"]["flashmla"],
        ),
    ]
    table = [
        {"row": r, "ours": round(o, 1), "published": round(t, 1), "ratio": round(o / t, 3)}
        for r, o, t in rows
    ]
    out = {"rows": table, "prefill": pf, "decode": dc, "mla_kernel": k}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{'':44}{'ours':>12}{'published':>12}{'ours/pub':>10}")
    for r in table:
        print(f"{r['row']:44}{r['ours']:>12,.0f}{r['published']:>12,.0f}{r['ratio']:>10.2f}")
    for name, part in (("prefill", pf), ("decode", dc)):
        rest = {k_: v for k_, v in part.items() if k_ != "ours_tok_s_node"}
        print(f"\n{name}: " + json.dumps(rest))


if __name__ == "__main__":
    main()
