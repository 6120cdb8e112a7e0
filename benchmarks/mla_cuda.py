"""Latent attention (MLA) on a CUDA machine in one go.

1. Exactness: tiny random DeepSeek-V2-Lite- and V3-shaped checkpoints served by the engine on
   CUDA (fp32, the Triton MLA kernel for every row) against transformers on the CPU: the largest
   logit difference and whether 24 greedy tokens are identical.
2. The MLA decode kernel at DeepSeek-V3's widths (latent 512 + RoPE 64, block 16, bf16 pool), one
   decode row per sequence, beside torch doing the same absorbed attention by gathering each
   sequence's latents and two batched matmuls (what the engine would do without the kernel): the
   time per layer of each, the latent bytes read per second, the largest difference between them.
   Heads 128 (one rank) and 16 (a rank of TP 8); the kernel at each `--heads-per-program` x
   `--tokens-per-tile` choice, its context split over enough programs to fill the device.

    python benchmarks/mla_cuda.py [--json] [--batch 64] [--context 4096] [--repeats 20]
        [--heads-per-program 16,32,64] [--tokens-per-tile 32,64] [--device cpu]

Needs the dev extra (transformers) and a CUDA device (exits 2 without); `--device cpu` with
TRITON_INTERPRET=1 and small sizes is a dry run of the script. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

PROMPT = [int(t) for t in "1 17 99 3 150 42 8 8 200 5 61 77 13 190 4 33 120 9 56 71 2 140".split()]


def exactness(arch: str, seed: int, device: str) -> dict:
    import transformers

    from pddflow.core.payloads import SamplingParams
    from pddflow.operators.engine import Engine, EngineConfig
    from pddflow.testing import tiny_checkpoints

    with tempfile.TemporaryDirectory() as tmp:
        path = getattr(tiny_checkpoints, f"tiny_{arch}")(Path(tmp) / arch, seed=seed)
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        hf.generation_config.eos_token_id = None
        with torch.inference_mode():
            ref = hf(torch.tensor([PROMPT])).logits[0]
            gen = hf.generate(
                torch.tensor([PROMPT]), max_new_tokens=24, do_sample=False, pad_token_id=0
            )
        # fp32 (CUDA's default is bf16): an exactness check, not a speed one
        cfg = EngineConfig(device=device, dtype="float32", kv_cache_bytes=2**24, chunk_size=8)
        engine = Engine.from_spec(str(path), cfg)
        ours = engine.score(PROMPT).float().cpu()
        tokens = engine.generate([PROMPT], SamplingParams(max_tokens=24))[0].output_ids
    return {
        "arch": arch,
        "logits_max_diff_vs_hf": float((ours - ref).abs().max()),
        "greedy_equals_hf": tokens == gen[0, len(PROMPT) :].tolist(),
    }


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _time(fn, repeats: int, dev: torch.device) -> float:
    for _ in range(3):
        fn()
    _sync(dev)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(dev)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def decode_kernel(
    heads: int,
    batch: int,
    context: int,
    repeats: int,
    hpps: list[int],
    tiles: list[int],
    device: str,
) -> dict:
    from pddflow.kernels._triton_mla import mla_attention_triton
    from pddflow.kernels.paged_attention import SeqSpan, _triton_meta

    latent, rope, bs, dev = 512, 64, 16, torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    per_seq = -(-context // bs)
    pool = torch.randn(batch * per_seq, 1, 1, bs, 1, latent + rope, device=dev, generator=g)
    pool = pool.to(torch.bfloat16)
    order = torch.randperm(batch * per_seq, device=dev, generator=g).tolist()  # scattered blocks
    tables = [order[i * per_seq : (i + 1) * per_seq] for i in range(batch)]
    spans = [SeqSpan(i, 1, context - 1, tables[i]) for i in range(batch)]
    meta = _triton_meta(spans, bs, dev)
    q = torch.randn(batch, heads, latent + rope, device=dev, generator=g).to(torch.bfloat16)
    scale = (128 + 64) ** -0.5
    index = torch.tensor(tables, device=dev)

    def torch_absorbed() -> torch.Tensor:
        kv = pool[index, 0, 0].reshape(batch, per_seq * bs, latent + rope)[:, :context]
        s = torch.matmul(q, kv.transpose(1, 2)).float() * scale  # [B, H, ctx]
        p = torch.softmax(s, dim=-1).to(kv.dtype)
        return torch.matmul(p, kv[..., :latent])

    ref = torch_absorbed()
    row: dict = {"heads": heads, "batch": batch, "context": context}
    latent_bytes = batch * context * (latent + rope) * 2
    t_torch = _time(torch_absorbed, repeats, dev)
    row["torch_ms"] = t_torch * 1e3
    row["torch_gb_per_s"] = latent_bytes / t_torch / 1e9
    for hpp in hpps:
        for tile in tiles:

            def kernel(hpp=hpp, tile=tile) -> torch.Tensor:
                return mla_attention_triton(
                    q, pool, 0, *meta, scale, latent, heads_per_program=hpp, tokens_per_tile=tile
                )

            out = kernel()
            t = _time(kernel, repeats, dev)
            key = f"triton_hpp{hpp}_n{tile}"
            row[f"{key}_ms"] = t * 1e3
            row[f"{key}_gb_per_s"] = latent_bytes / t / 1e9
            row[f"{key}_max_diff_vs_torch"] = float((out.float() - ref.float()).abs().max())
            row[f"{key}_speedup"] = t_torch / t
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--heads-per-program", default="16,32,64")
    ap.add_argument("--tokens-per-tile", default="32,64")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device (or --device cpu with TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    hpps = [int(x) for x in args.heads_per_program.split(",")]
    tiles = [int(x) for x in args.tokens_per_tile.split(",")]
    dev = args.device
    out = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else dev,
        "exactness": [exactness("deepseek_v2", 6, dev), exactness("deepseek_v3", 7, dev)],
        "decode": [
            decode_kernel(
                h, args.batch, args.context, args.repeats, [x for x in hpps if x <= h], tiles, dev
            )
            for h in (128, 16)
        ],
    }
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for row in out["exactness"]:
            print(row)
        for row in out["decode"]:
            print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
    ok = all(r["greedy_equals_hf"] and r["logits_max_diff_vs_hf"] < 1e-3 for r in out["exactness"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
