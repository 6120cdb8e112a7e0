"""Triton latent attention (MLA, absorbed; CUDA, or TRITON_INTERPRET=1) over the one-plane pool:
one program per (query row, block of query heads). Every head of the block reads the same cached
latent and RoPE key once per KV block: scores against [latent, RoPE key], values the latent itself,
an online softmax over the row's context. A row's result depends only on its own query and
context. Tiles of at least 16 heads and 16 tokens use dots in fp32 (IEEE precision for an fp32
pool; TF32 for a 16-bit one, whose values TF32 holds exactly); smaller ones, elementwise
products."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _mla_attention_kernel(
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
    stride_ot,
    stride_oh,
    stride_pb,
    stride_pl,
    stride_ps,
    stride_tab,
    H: tl.constexpr,
    HB: tl.constexpr,
    DL: tl.constexpr,
    DL_PAD: tl.constexpr,
    DR: tl.constexpr,
    DR_PAD: tl.constexpr,
    BS: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    row = tl.program_id(0)
    h = tl.program_id(1) * HB + tl.arange(0, HB)
    span = tl.load(row_span_ptr + row)
    ctx = tl.load(row_ctx_ptr + row)
    dl = tl.arange(0, DL_PAD)
    dr = tl.arange(0, DR_PAD)
    t = tl.arange(0, BS)
    hmask = h < H
    lmask = dl < DL
    rmask = dr < DR
    q_row = q_ptr + row.to(tl.int64) * stride_qt + h[:, None] * stride_qh
    q_lat = tl.load(q_row + dl[None, :], mask=hmask[:, None] & lmask[None, :], other=0.0)
    q_rope = tl.load(q_row + DL + dr[None, :], mask=hmask[:, None] & rmask[None, :], other=0.0)
    q_lat = q_lat.to(tl.float32) * scale
    q_rope = q_rope.to(tl.float32) * scale
    m_i = tl.full([HB], float("-inf"), tl.float32)
    l_i = tl.zeros([HB], tl.float32)
    acc = tl.zeros([HB, DL_PAD], tl.float32)
    for j in range(0, tl.cdiv(ctx, BS)):
        b = tl.load(tables_ptr + span * stride_tab + j).to(tl.int64)
        slots = pool_ptr + b * stride_pb + layer * stride_pl + t[:, None] * stride_ps
        latent = tl.load(slots + dl[None, :], mask=lmask[None, :], other=0.0).to(tl.float32)
        k_rope = tl.load(slots + DL + dr[None, :], mask=rmask[None, :], other=0.0).to(tl.float32)
        if DOT:
            s = tl.dot(q_lat, tl.trans(latent), input_precision=PRECISION)
            s += tl.dot(q_rope, tl.trans(k_rope), input_precision=PRECISION)
        else:
            s = tl.sum(q_lat[:, None, :] * latent[None, :, :], axis=2)
            s += tl.sum(q_rope[:, None, :] * k_rope[None, :, :], axis=2)
        s = tl.where(((j * BS + t) < ctx)[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT:
            pv = tl.dot(p, latent, input_precision=PRECISION)
        else:
            pv = tl.sum(p[:, :, None] * latent[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    o = acc / l_i[:, None]
    o_ptr = out_ptr + row.to(tl.int64) * stride_ot + h[:, None] * stride_oh + dl[None, :]
    tl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=hmask[:, None] & lmask[None, :])


def mla_attention_triton(
    q: torch.Tensor,
    pool: torch.Tensor,
    layer: int,
    tables: torch.Tensor,
    row_span: torch.Tensor,
    row_ctx: torch.Tensor,
    scale: float,
    latent_dim: int,
    heads_per_program: int = 16,
) -> torch.Tensor:
    """q [T, H, latent + rope] (the absorbed query, RoPE applied), pool [blocks, layers, 1, bs, 1,
    latent + rope]; returns [T, H, latent]."""
    T, H, D = q.shape
    if pool.shape[2] != 1 or pool.shape[4] != 1 or pool.shape[5] != D:
        raise ValueError(f"pool {tuple(pool.shape)} is not a latent pool for queries of width {D}")
    q = q.contiguous()
    out = q.new_empty(T, H, latent_dim)
    if T == 0:
        return out
    hb = min(triton.next_power_of_2(H), heads_per_program)
    rope = D - latent_dim
    bs = pool.shape[3]
    dl_pad, dr_pad = triton.next_power_of_2(latent_dim), triton.next_power_of_2(rope)
    _mla_attention_kernel[(T, triton.cdiv(H, hb))](
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
        out.stride(0),
        out.stride(1),
        pool.stride(0),
        pool.stride(1),
        pool.stride(3),
        tables.stride(0),
        H=H,
        HB=hb,
        DL=latent_dim,
        DL_PAD=dl_pad,
        DR=rope,
        DR_PAD=dr_pad,
        BS=bs,
        DOT=min(hb, bs, dl_pad, dr_pad) >= 16,
        PRECISION="ieee" if pool.dtype == torch.float32 else "tf32",
        num_stages=1,  # a pipelined [16, 512] fp32 latent tile overflows shared memory
    )
    return out
