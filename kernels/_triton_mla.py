"""Triton latent attention (MLA, absorbed; CUDA, or TRITON_INTERPRET=1) over the one-plane pool:
one program per (query row, block of query heads, slice of the row's context). Every head of the
block reads the same cached latent and RoPE key once per tile of `BLOCK_N` tokens (several KV
blocks, gathered through the block table): scores against [latent, RoPE key], values the latent
itself, an online softmax. Where a step has too few rows to fill the device, the context is split
(flash-decoding) and the slices' partial results are combined after. A row's result depends only
on its own query and context.

Tiles of at least 16 heads use dots: 16-bit operands with fp32 accumulation for a 16-bit pool,
IEEE fp32 for an fp32 one; smaller tiles multiply elementwise."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _mla_attention_kernel(
    q_ptr,
    pool_ptr,
    out_ptr,  # [T, H, DL] when SPLITS == 1, else the unnormalised partials [T, H, SPLITS, DL]
    m_ptr,  # [T, H, SPLITS]: each slice's running max (SPLITS > 1)
    l_ptr,  # [T, H, SPLITS]: each slice's softmax denominator (SPLITS > 1)
    tables_ptr,
    row_span_ptr,
    row_ctx_ptr,
    layer,
    scale,
    stride_qt,
    stride_qh,
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
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    DOT: tl.constexpr,
    IEEE: tl.constexpr,
):
    row = tl.program_id(0)
    h = tl.program_id(1) * HB + tl.arange(0, HB)
    split = tl.program_id(2)
    span = tl.load(row_span_ptr + row)
    ctx = tl.load(row_ctx_ptr + row)
    per_split = tl.cdiv(tl.cdiv(ctx, SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(ctx, start + per_split)
    dl = tl.arange(0, DL_PAD)
    dr = tl.arange(0, DR_PAD)
    n = tl.arange(0, BLOCK_N)
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
    for t0 in range(start, end, BLOCK_N):
        tok = t0 + n
        live = tok < end
        block = tl.load(tables_ptr + span * stride_tab + tok // BS, mask=live, other=0)
        slots = pool_ptr + block.to(tl.int64) * stride_pb + layer * stride_pl
        slots += (tok % BS) * stride_ps
        latent = tl.load(
            slots[:, None] + dl[None, :], mask=live[:, None] & lmask[None, :], other=0.0
        )
        k_rope = tl.load(
            slots[:, None] + DL + dr[None, :], mask=live[:, None] & rmask[None, :], other=0.0
        )
        if DOT:
            if IEEE:
                s = tl.dot(q_lat, tl.trans(latent), input_precision="ieee")
                s += tl.dot(q_rope, tl.trans(k_rope), input_precision="ieee")
            else:
                s = tl.dot(q_lat.to(latent.dtype), tl.trans(latent))
                s += tl.dot(q_rope.to(k_rope.dtype), tl.trans(k_rope))
        else:
            s = tl.sum(q_lat[:, None, :] * latent.to(tl.float32)[None, :, :], axis=2)
            s += tl.sum(q_rope[:, None, :] * k_rope.to(tl.float32)[None, :, :], axis=2)
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT:
            if IEEE:
                pv = tl.dot(p, latent, input_precision="ieee")
            else:
                pv = tl.dot(p.to(latent.dtype), latent)
        else:
            pv = tl.sum(p[:, :, None] * latent.to(tl.float32)[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    omask = hmask[:, None] & lmask[None, :]
    if SPLITS == 1:
        o_ptr = out_ptr + (row.to(tl.int64) * H + h[:, None]) * DL + dl[None, :]
        tl.store(o_ptr, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=omask)
    else:
        part = (row.to(tl.int64) * H + h) * SPLITS + split
        tl.store(out_ptr + part[:, None] * DL + dl[None, :], acc, mask=omask)
        tl.store(m_ptr + part, m_i, mask=hmask)
        tl.store(l_ptr + part, l_i, mask=hmask)


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
    tokens_per_tile: int = 32,
    splits: int | None = None,
) -> torch.Tensor:
    """q [T, H, latent + rope] (the absorbed query, RoPE applied), pool [blocks, layers, 1, bs, 1,
    latent + rope]; returns [T, H, latent]. `splits`: context slices per row (None: enough to
    give the device's multiprocessors two programs each, at most one per tile of the longest
    context)."""
    T, H, D = q.shape
    if pool.shape[2] != 1 or pool.shape[4] != 1 or pool.shape[5] != D:
        raise ValueError(f"pool {tuple(pool.shape)} is not a latent pool for queries of width {D}")
    q = q.contiguous()
    out = q.new_empty(T, H, latent_dim)
    if T == 0:
        return out
    hb = min(triton.next_power_of_2(H), heads_per_program)
    rope, bs = D - latent_dim, pool.shape[3]
    block_n = max(tokens_per_tile, bs)
    dl_pad, dr_pad = triton.next_power_of_2(latent_dim), triton.next_power_of_2(rope)
    programs = T * triton.cdiv(H, hb)
    if splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
        longest = int(row_ctx.max())
        splits = max(1, min(-(-2 * sms // programs), -(-longest // block_n)))
    if splits == 1:
        partial = maxes = denoms = out  # the kernel writes the result; the others go unused
    else:
        f32 = torch.float32
        partial = torch.empty(T, H, splits, latent_dim, dtype=f32, device=q.device)
        maxes = torch.empty(T, H, splits, dtype=f32, device=q.device)
        denoms = torch.empty_like(maxes)
    sixteen_bit = pool.dtype != torch.float32
    _mla_attention_kernel[(T, triton.cdiv(H, hb), splits)](
        q,
        pool,
        partial,
        maxes,
        denoms,
        tables,
        row_span,
        row_ctx,
        layer,
        scale,
        q.stride(0),
        q.stride(1),
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
        BLOCK_N=block_n,
        SPLITS=splits,
        DOT=min(hb, block_n, dl_pad, dr_pad) >= 16,
        IEEE=not sixteen_bit,
        num_stages=2 if sixteen_bit else 1,  # an fp32 tile pipelined overflows shared memory
    )
    if splits == 1:
        return out
    weight = torch.exp(maxes - maxes.amax(-1, keepdim=True))  # an empty slice's max is -inf
    merged = (partial * weight[..., None]).sum(2) / (denoms * weight).sum(-1)[..., None]
    return merged.to(out.dtype)
