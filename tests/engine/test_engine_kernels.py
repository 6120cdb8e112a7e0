"""Kernels: Triton against the torch reference. On CPU the Triton kernels run under
TRITON_INTERPRET=1 in a subprocess (the variable must be set before triton is imported); the `gpu`
tests run them on CUDA and skip cleanly without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from pddflow.kernels.paged_attention import (
    SeqSpan,
    calibrate,
    paged_attention_torch,
    plan_attention,
    tree_sum,
)

# A mixed batch: decode rows of different lengths, a prefill chunk starting mid-block, a fresh
# sequence, a chunk spanning several blocks; GQA with 3 query heads per KV head.
CASE = textwrap.dedent("""
    import torch
    from pddflow.kernels.paged_attention import (
        SeqSpan, plan_attention, paged_attention_torch, _triton_meta)
    def case(device):
        g = torch.Generator().manual_seed(0)
        NB, L, bs, hkv, D, G = 12, 2, 16, 2, 16, 3
        pool = torch.randn(NB, L, 2, bs, hkv, D, generator=g)
        spans = [SeqSpan(0, 1, 20, [3, 7]), SeqSpan(1, 5, 10, [5]), SeqSpan(6, 1, 0, [9]),
                 SeqSpan(7, 3, 30, [1, 2, 4]), SeqSpan(10, 1, 47, [11, 0, 6])]
        q = torch.randn(11, hkv * G, D, generator=g)
        plan = plan_attention(spans, block_size=bs, num_layers=L, num_kv_heads=hkv, group_size=G,
                              tile=16, row_multiple=4)
        ref = paged_attention_torch(q, pool, 1, plan, 0.25)
        meta = _triton_meta(spans, bs, torch.device(device))
        return pool, q, ref, meta
""")

# Latent attention (MLA, absorbed) over a one-plane pool: by default latent 24 + RoPE 8 as the one
# KV head and 5 query heads (not powers of two: the elementwise path); 16 heads over 32 + 16, the
# dot path. The same mixed batch.
MLA_CASE = textwrap.dedent("""
    import torch
    from pddflow.kernels.paged_attention import (
        SeqSpan, plan_attention, paged_attention_torch, _triton_meta)
    def mla_case(device, H=5, DL=24, DR=8):
        g = torch.Generator().manual_seed(5)
        NB, L, bs = 12, 2, 16
        pool = torch.randn(NB, L, 1, bs, 1, DL + DR, generator=g)
        spans = [SeqSpan(0, 1, 20, [3, 7]), SeqSpan(1, 5, 10, [5]), SeqSpan(6, 1, 0, [9]),
                 SeqSpan(7, 3, 30, [1, 2, 4]), SeqSpan(10, 1, 47, [11, 0, 6])]
        q = torch.randn(11, H, DL + DR, generator=g)
        plan = plan_attention(spans, block_size=bs, num_layers=L, num_kv_heads=1, group_size=H,
                              tile=16, row_multiple=4, kv_planes=1, value_dim=DL)
        ref = paged_attention_torch(q, pool, 1, plan, 0.2)
        meta = _triton_meta(spans, bs, torch.device(device))
        return pool, q, ref, meta, DL
""")

SCRIPT = (
    CASE
    + MLA_CASE
    + textwrap.dedent("""
    import json, os
    assert os.environ["TRITON_INTERPRET"] == "1"
    from pddflow.kernels._triton_attention import paged_attention_triton
    from pddflow.kernels._triton_kv_copy import gather_blocks_triton, scatter_blocks_triton
    pool, q, ref, (tables, row_span, row_ctx) = case("cpu")
    out = paged_attention_triton(q, pool, 1, tables, row_span, row_ctx, 0.25)
    ids = torch.tensor([4, 0, 11])
    gathered = gather_blocks_triton(pool, ids)
    data = torch.randn(3, *pool.shape[1:])
    p2 = pool.clone(); scatter_blocks_triton(p2, ids, data)
    p3 = pool.clone(); p3[ids] = data
    from pddflow.kernels._triton_mla import mla_attention_triton
    mla_diffs = []
    for shape, hpp, splits in (((5, 24, 8), 4, None), ((16, 32, 16), 16, 3)):
        lpool, lq, lref, (lt, lspan, lctx), dl = mla_case("cpu", *shape)
        mla = mla_attention_triton(lq, lpool, 1, lt, lspan, lctx, 0.2, dl, heads_per_program=hpp,
                                   tokens_per_tile=16, splits=splits)
        mla_diffs.append((mla - lref).abs().max().item())
    print(json.dumps({"attn_max_diff": (out - ref).abs().max().item(),
                      "mla_max_diff": max(mla_diffs),
                      "gather_equal": torch.equal(gathered, pool[ids]),
                      "scatter_equal": torch.equal(p2, p3)}))
""")
)


@pytest.mark.slow
def test_triton_kernels_match_reference_under_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["attn_max_diff"] < 1e-5
    assert res["mla_max_diff"] < 1e-5  # 5 heads in blocks of 4 (one masked); dots, 3 splits
    assert res["gather_equal"] and res["scatter_equal"]


def test_tree_sum_ignores_trailing_zeros():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 5, generator=g) * 1e3
    padded = torch.cat([x, torch.zeros(9, 5)])
    assert torch.equal(tree_sum(x, 0), tree_sum(padded, 0))
    assert torch.allclose(tree_sum(x, 0), x.sum(0), rtol=1e-5)
    assert torch.equal(tree_sum(x[:1], 0), x[0])


def test_calibration_finds_an_invariant_setting():
    n = calibrate(16, 2, 3, 16, torch.get_num_threads())
    assert n.invariant and n.row_multiple in (4, 8, 16, 32, 64)


def test_reference_matches_naive_attention():
    g = torch.Generator().manual_seed(1)
    NB, bs, hkv, D, G = 9, 4, 2, 8, 2
    pool = torch.randn(NB, 1, 2, bs, hkv, D, generator=g)
    table = [8, 2, 5, 0, 7]
    n, start = 6, 13
    q = torch.randn(n, hkv * G, D, generator=g)
    plan = plan_attention(
        [SeqSpan(0, n, start, table)],
        block_size=bs,
        num_layers=1,
        num_kv_heads=hkv,
        group_size=G,
        tile=8,
        row_multiple=4,
    )
    out = paged_attention_torch(q, pool, 0, plan, D**-0.5)
    K = pool[table, 0, 0].reshape(-1, hkv, D)
    V = pool[table, 0, 1].reshape(-1, hkv, D)
    for r in range(n):
        ctx = start + r + 1
        for h in range(hkv * G):
            s = (K[:ctx, h // G] @ q[r, h]) * D**-0.5
            expect = torch.softmax(s, 0) @ V[:ctx, h // G]
            assert torch.allclose(out[r, h], expect, atol=1e-5)


def test_latent_reference_matches_naive_attention():
    """One plane: every query head scores against [latent, RoPE key] and averages the latent."""
    g = torch.Generator().manual_seed(2)
    NB, bs, DL, DR, H = 9, 4, 12, 4, 3
    pool = torch.randn(NB, 1, 1, bs, 1, DL + DR, generator=g)
    table = [8, 2, 5, 0, 7]
    n, start = 6, 13
    q = torch.randn(n, H, DL + DR, generator=g)
    plan = plan_attention(
        [SeqSpan(0, n, start, table)],
        block_size=bs,
        num_layers=1,
        num_kv_heads=1,
        group_size=H,
        tile=8,
        row_multiple=4,
        kv_planes=1,
        value_dim=DL,
    )
    out = paged_attention_torch(q, pool, 0, plan, 0.3)
    assert out.shape == (n, H, DL)
    K = pool[table, 0, 0].reshape(-1, DL + DR)
    for r in range(n):
        ctx = start + r + 1
        for h in range(H):
            expect = torch.softmax((K[:ctx] @ q[r, h]) * 0.3, 0) @ K[:ctx, :DL]
            assert torch.allclose(out[r, h], expect, atol=1e-5)


def test_gather_scatter_reference():
    from pddflow.kernels.kv_copy import gather_blocks, scatter_blocks

    pool = torch.randn(6, 2, 2, 4, 2, 8)
    got = gather_blocks(pool, [5, 1])
    assert got.is_contiguous() and torch.equal(got, pool[[5, 1]])
    fresh = torch.zeros_like(pool)
    scatter_blocks(fresh, [0, 3], got)
    assert torch.equal(fresh[0], pool[5]) and torch.equal(fresh[3], pool[1])
    with pytest.raises(ValueError, match="does not fit"):
        scatter_blocks(fresh, [0], got)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
def test_triton_attention_on_cuda_matches_reference():
    ns: dict = {}
    exec(CASE, ns)
    pool, q, ref, meta = ns["case"]("cuda")
    from pddflow.kernels._triton_attention import paged_attention_triton

    out = paged_attention_triton(q.cuda(), pool.cuda(), 1, *meta, 0.25)
    assert (out.cpu() - ref).abs().max().item() < 1e-4


@pytest.mark.gpu
@gpu
def test_triton_mla_on_cuda_matches_reference():
    ns: dict = {}
    exec(MLA_CASE, ns)
    from pddflow.kernels._triton_mla import mla_attention_triton

    for shape, hpp, splits in (((5, 24, 8), 4, None), ((16, 32, 16), 16, 3)):
        pool, q, ref, meta, dl = ns["mla_case"]("cuda", *shape)
        out = mla_attention_triton(
            q.cuda(), pool.cuda(), 1, *meta, 0.2, dl, heads_per_program=hpp, splits=splits
        )
        assert (out.cpu() - ref).abs().max().item() < 1e-4


@pytest.mark.gpu
@gpu
def test_triton_kv_copy_on_cuda_and_timing(capsys):
    from pddflow.kernels._triton_kv_copy import gather_blocks_triton, scatter_blocks_triton

    pool = torch.randn(4096, 16, 2, 16, 4, 64, device="cuda")  # tiny-llama geometry: 512 KiB/block
    ids = torch.randperm(4096, device="cuda")[:256]
    out = gather_blocks_triton(pool, ids)
    assert torch.equal(out, pool[ids])
    fresh = torch.zeros_like(pool)
    scatter_blocks_triton(fresh, ids, out)
    assert torch.equal(fresh[ids], out)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        gather_blocks_triton(pool, ids)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / 10
    with capsys.disabled():
        print(
            f"\ngather 256 blocks ({out.numel() * 4 / 2**20:.0f} MiB): {dt * 1e3:.3f} ms, "
            f"{out.numel() * 8 / dt / 1e9:.0f} GB/s read+write"
        )


@pytest.mark.gpu
@gpu
def test_engine_runs_on_cuda():
    from pddflow.core.payloads import SamplingParams
    from pddflow.operators.engine import Engine, EngineConfig

    e = Engine.from_spec("builtin:tiny-llama", EngineConfig(device="cuda", kv_cache_bytes=2**28))
    seq = e.generate([[256, 1, 2, 3]], SamplingParams(max_tokens=8))[0]
    assert len(seq.output_ids) == 8
