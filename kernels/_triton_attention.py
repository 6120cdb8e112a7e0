"""Triton paged attention (CUDA, or TRITON_INTERPRET=1): one program per (query row, KV head), so a
row's result depends only on its own query and context."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    pool_ptr,
    out_ptr,
    tables_ptr,
    row_span_ptr,
    row_ctx_ptr,
    layer,
    scale,
    stride_qt,
    stride_qh,
    stride_pb,
    stride_pl,
    stride_pkv,
    stride_ps,
    stride_ph,
    stride_tab,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
):
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    span = tl.load(row_span_ptr + row)
    ctx = tl.load(row_ctx_ptr + row)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    t = tl.arange(0, BS)
    gmask = g < G
    q_off = row.to(tl.int64) * stride_qt + (kvh * G + g)[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=gmask[:, None], other=0.0).to(tl.float32) * scale
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    kv_off = t[:, None] * stride_ps + d[None, :]
    for j in range(0, tl.cdiv(ctx, BS)):
        b = tl.load(tables_ptr + span * stride_tab + j).to(tl.int64)
        base = pool_ptr + b * stride_pb + layer * stride_pl + kvh * stride_ph
        k = tl.load(base + kv_off).to(tl.float32)
        v = tl.load(base + stride_pkv + kv_off).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        s = tl.where(((j * BS + t) < ctx)[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(out_ptr + q_off, o.to(out_ptr.dtype.element_ty), mask=gmask[:, None])


def paged_attention_triton(
    q: torch.Tensor,
    pool: torch.Tensor,
    layer: int,
    tables: torch.Tensor,
    row_span: torch.Tensor,
    row_ctx: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    T, H, D = q.shape
    hkv, bs = pool.shape[4], pool.shape[3]
    g = H // hkv
    q = q.contiguous()
    out = torch.empty_like(q)
    if T == 0:
        return out
    _paged_attention_kernel[(T, hkv)](
        q,
        pool,
        out,
        tables,
        row_span,
        row_ctx,
        layer,
        scale,
        q.stride(0),
        q.stride(1),
        pool.stride(0),
        pool.stride(1),
        pool.stride(2),
        pool.stride(3),
        pool.stride(4),
        tables.stride(0),
        G=g,
        G_PAD=triton.next_power_of_2(g),
        D=D,
        BS=bs,
    )
    return out
