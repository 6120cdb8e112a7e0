"""Paged attention for decode rows and prefill/extend chunks alike, so a token's output cannot
depend on its entry point; the torch path is tiled to stay batch-invariant on CPU BLAS
(docs/engine.md, Batch invariance). A pool of one plane is latent attention's (MLA, absorbed): its
one KV head is the key, the first `value_dim` values of it the value."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from pddflow.kernels import DEFAULT_TILE


@dataclass(frozen=True)
class SeqSpan:
    """One sequence's rows [row_start, +num_rows) at positions from start_pos, K/V already in the
    pool: the last row's context is start_pos + num_rows tokens."""

    row_start: int
    num_rows: int
    start_pos: int
    block_table: Sequence[int]

    @property
    def context_len(self) -> int:
        return self.start_pos + self.num_rows


@dataclass
class _Group:
    """Spans attended together: a bucket of decode rows, or one chunk split into row blocks."""

    batch: int
    key_len: int  # the longest context rounded up to the tile
    key_index: torch.Tensor  # [B, Hkv, L] flat pool row index (layer 0, K)
    rows: torch.Tensor | slice
    num_rows: int
    mask: torch.Tensor | None = None  # decode: [B, 1, 1, L], True where the key is hidden
    # chunk: (row0, row1, keys, mask_from, mask [rows, keys - mask_from]) over [Hkv, n*G, D] rows
    blocks: list[tuple[int, int, int, int, torch.Tensor]] = field(default_factory=list)


@dataclass
class AttentionPlan:
    """What of one forward step's attention is the same for every layer."""

    spans: list[SeqSpan]
    num_rows: int
    block_size: int
    num_layers: int
    num_kv_heads: int
    group_size: int
    tile: int
    row_multiple: int
    decode_kt_view: bool = True
    kv_planes: int = 2  # 1: latent attention's one plane, its value the key's first value_dim
    value_dim: int = 0  # 0: head_dim
    groups: list[_Group] = field(default_factory=list)
    triton_meta: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


# chunk rows per block: scores stay cache-sized and each block stops at its own last key
ROW_BLOCK = 256


def plan_attention(
    spans: Sequence[SeqSpan],
    *,
    block_size: int,
    num_layers: int,
    num_kv_heads: int,
    group_size: int,
    device: torch.device | str = "cpu",
    tile: int = DEFAULT_TILE,
    row_multiple: int = 8,
    decode_kt_view: bool = True,
    kv_planes: int = 2,
    value_dim: int = 0,
) -> AttentionPlan:
    device = torch.device(device)
    if tile % block_size:
        raise ValueError(f"attention tile {tile} must be a multiple of the block size {block_size}")
    spans = list(spans)
    plan = AttentionPlan(
        spans,
        sum(s.num_rows for s in spans),
        block_size,
        num_layers,
        num_kv_heads,
        group_size,
        tile,
        row_multiple,
        decode_kt_view,
        kv_planes,
        value_dim,
    )
    if device.type == "cuda":
        plan.triton_meta = _triton_meta(spans, block_size, device)
        return plan
    for bucket in _decode_buckets([s for s in spans if s.num_rows == 1], tile):
        plan.groups.append(_decode_group(bucket, plan, device))
    for s in spans:
        if s.num_rows > 1:
            plan.groups.append(_chunk_group(s, plan, device))
    return plan


def _decode_buckets(spans: list[SeqSpan], tile: int) -> list[list[SeqSpan]]:
    """Buckets of similar context length: a bucket pads every row to its longest."""
    spans = sorted(spans, key=lambda s: -s.context_len)
    buckets: list[list[SeqSpan]] = []
    for s in spans:
        if buckets:
            b = buckets[-1]
            longest = _round_up(b[0].context_len, tile)
            own = sum(_round_up(x.context_len, tile) for x in b) + _round_up(s.context_len, tile)
            if longest * (len(b) + 1) <= 1.5 * own:
                b.append(s)
                continue
        buckets.append([s])
    return buckets


def _key_index(
    spans: list[SeqSpan], plan: AttentionPlan, key_len: int, device: torch.device
) -> torch.Tensor:
    bs, hkv = plan.block_size, plan.num_kv_heads
    tables = torch.zeros(len(spans), key_len // bs, dtype=torch.long)
    for i, s in enumerate(spans):
        need = -(-s.context_len // bs)
        if len(s.block_table) < need:
            raise ValueError(f"block table has {len(s.block_table)} blocks, context needs {need}")
        # Padding reads block 0: its keys are masked and the pool is finite, so 0 * V stays 0.
        tables[i, :need] = torch.as_tensor(list(s.block_table[:need]), dtype=torch.long)
    # row index into pool.view(-1, head_dim) for layer 0, K
    block_stride = plan.num_layers * plan.kv_planes * bs * hkv
    slot = (tables[:, :, None] * block_stride + torch.arange(bs)[None, None, :] * hkv).reshape(
        len(spans), key_len
    )
    return (slot[:, None, :] + torch.arange(hkv)[None, :, None]).to(device)


def _decode_group(spans: list[SeqSpan], plan: AttentionPlan, device: torch.device) -> _Group:
    key_len = _round_up(max(s.context_len for s in spans), plan.tile)
    ctx = torch.tensor([s.context_len for s in spans])
    hidden = (torch.arange(key_len)[None, :] >= ctx[:, None])[:, None, None, :]
    rows = torch.tensor([s.row_start for s in spans], dtype=torch.long, device=device)
    return _Group(
        len(spans),
        key_len,
        _key_index(spans, plan, key_len, device),
        rows,
        1,
        mask=hidden.to(device),
    )


def _chunk_group(s: SeqSpan, plan: AttentionPlan, device: torch.device) -> _Group:
    g, tile = plan.group_size, plan.tile
    key_len = _round_up(s.context_len, tile)
    grp = _Group(
        1,
        key_len,
        _key_index([s], plan, key_len, device),
        slice(s.row_start, s.row_start + s.num_rows),
        s.num_rows,
    )
    total = s.num_rows * g
    step = _round_up(ROW_BLOCK, plan.row_multiple * g)
    for r0 in range(0, total, step):
        r1 = min(total, r0 + step)
        first, last = s.start_pos + r0 // g, s.start_pos + (r1 - 1) // g
        keys = _round_up(last + 1, tile)
        pos = s.start_pos + torch.arange(r0, r1) // g
        hidden = torch.arange(first + 1, keys)[None, :] > pos[:, None]
        grp.blocks.append((r0, r1, keys, first + 1, hidden.to(device)))
    return grp


def _triton_meta(spans: list[SeqSpan], block_size: int, device: torch.device):
    num_blocks = max(-(-s.context_len // block_size) for s in spans)
    tables = torch.zeros(len(spans), max(num_blocks, 1), dtype=torch.int32)
    row_span, row_ctx = [], []
    for i, s in enumerate(spans):
        need = -(-s.context_len // block_size)
        tables[i, :need] = torch.as_tensor(list(s.block_table[:need]), dtype=torch.int32)
        row_span += [i] * s.num_rows
        row_ctx += [s.start_pos + r + 1 for r in range(s.num_rows)]
    return (
        tables.to(device),
        torch.tensor(row_span, dtype=torch.int32, device=device),
        torch.tensor(row_ctx, dtype=torch.int32, device=device),
    )


def paged_attention(
    q: torch.Tensor, pool: torch.Tensor, layer: int, plan: AttentionPlan, scale: float
) -> torch.Tensor:
    """q [T, H, D] (RoPE applied), this step's K/V already in the pool; returns [T, H, D] (of
    latent attention [T, H, value_dim])."""
    if q.device.type == "cuda":
        tables, row_span, row_ctx = plan.triton_meta  # type: ignore[misc]
        if plan.kv_planes == 1:
            from pddflow.kernels._triton_mla import mla_attention_triton

            return mla_attention_triton(
                q, pool, layer, tables, row_span, row_ctx, scale, plan.value_dim
            )
        from pddflow.kernels._triton_attention import paged_attention_triton

        return paged_attention_triton(q, pool, layer, tables, row_span, row_ctx, scale)
    return paged_attention_torch(q, pool, layer, plan, scale)


def paged_attention_torch(
    q: torch.Tensor, pool: torch.Tensor, layer: int, plan: AttentionPlan, scale: float
) -> torch.Tensor:
    T, H, D = q.shape
    hkv, g, row_mult = plan.num_kv_heads, plan.group_size, plan.row_multiple
    Dv = plan.value_dim or D
    flat = pool.view(-1, D)
    layer_off = layer * plan.kv_planes * plan.block_size * hkv
    v_off = plan.block_size * hkv
    q = q * scale
    out = q.new_empty(T, H, Dv)
    for grp in plan.groups:
        idx = grp.key_index + layer_off
        K = flat.index_select(0, idx.view(-1)).view(grp.batch, hkv, grp.key_len, D)
        Kt = K.transpose(-1, -2)
        if plan.kv_planes == 1:  # latent: the value is the key's first Dv values
            V = K[..., :Dv]
        else:
            V = flat.index_select(0, (idx + v_off).view(-1)).view(grp.batch, hkv, grp.key_len, D)
        if grp.mask is None or not plan.decode_kt_view:
            # contiguous K^T speeds a chunk's GEMMs; same bits either way (calibrate() checks)
            Kt = Kt.contiguous()
        if grp.mask is not None:  # decode bucket: G rows per (span, KV head), padded
            qg = q.index_select(0, grp.rows).view(grp.batch, hkv, g, D)  # type: ignore[arg-type]
            qg = _pad_rows(qg, _round_up(g, row_mult))
            o = attend_tiles(qg, Kt, V, grp.mask, 0, plan.tile)[:, :, :g]
            out.index_copy_(0, grp.rows, o.reshape(grp.batch, H, Dv))  # type: ignore[arg-type]
            continue
        n = grp.num_rows
        qg = q[grp.rows].view(n, hkv, g, D).permute(1, 0, 2, 3).reshape(1, hkv, n * g, D)
        og = torch.empty(1, hkv, n * g, Dv, dtype=q.dtype)
        for r0, r1, keys, mask_from, hidden in grp.blocks:
            qb = _pad_rows(qg[:, :, r0:r1], _round_up(r1 - r0, row_mult))
            og[:, :, r0:r1] = attend_tiles(
                qb,
                Kt[..., :keys],
                V[:, :, :keys],
                _pad_rows(hidden, qb.shape[2], dim=0, value=True),
                mask_from,
                plan.tile,
            )[:, :, : r1 - r0]
        out[grp.rows] = og.view(hkv, n, g, Dv).permute(1, 0, 2, 3).reshape(n, H, Dv)
    return out


def _pad_rows(x: torch.Tensor, rows: int, dim: int = 2, value: float | bool = 0) -> torch.Tensor:
    extra = rows - x.shape[dim]
    if extra <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, torch.full(shape, value, dtype=x.dtype, device=x.device)], dim=dim)


def attend_tiles(
    q: torch.Tensor,
    Kt: torch.Tensor,
    V: torch.Tensor,
    hidden: torch.Tensor | None,
    mask_from: int,
    tile: int,
) -> torch.Tensor:
    """Row-invariant attention: q [B, Hkv, R, D] (pre-scaled), Kt [B, Hkv, D, L], V [B, Hkv, L, Dv],
    L a multiple of `tile`; `hidden` (True = masked) covers keys [mask_from, L). [B, Hkv, R, Dv]."""
    B, hkv, R, _ = q.shape
    L, D = V.shape[2], V.shape[3]
    num_tiles = L // tile
    s = torch.matmul(q, Kt)
    if hidden is not None and mask_from < L:
        s[..., mask_from:].masked_fill_(hidden, float("-inf"))
    s.sub_(s.amax(-1, keepdim=True)).exp_()
    tiles = s.view(B * hkv, R, num_tiles, tile)
    den = tiles.sum(-1)
    probs = tiles.transpose(1, 2).reshape(B * hkv * num_tiles, R, tile)
    o = torch.bmm(probs, V.reshape(B * hkv * num_tiles, tile, D)).view(B * hkv, num_tiles, R, D)
    return (tree_sum(o, 1) / tree_sum(den, 2)[..., None]).view(B, hkv, R, D)


def tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` by a fixed pairwise tree, an odd last element carried up: the same bits as
    the tree over any zero-padded length."""
    while x.shape[dim] > 1:
        n = x.shape[dim]
        pairs = x.narrow(dim, 0, n - n % 2).unflatten(dim, (-1, 2))
        summed = pairs.select(dim + 1, 0) + pairs.select(dim + 1, 1)
        x = torch.cat([summed, x.narrow(dim, n - 1, 1)], dim) if n % 2 else summed
    return x.squeeze(dim)


@dataclass(frozen=True)
class Numerics:
    row_multiple: int
    decode_kt_view: bool  # decode may feed K^T as a transposed view (no copy)
    invariant: bool  # False: no setting passed the check (outputs may differ across splits)


@functools.cache
def calibrate(
    head_dim: int,
    num_kv_heads: int,
    group_size: int,
    tile: int,
    num_threads: int,
    kv_planes: int = 2,
    value_dim: int = 0,
) -> Numerics:
    """The cheapest row-invariant setting on this machine; warns if none is."""
    shape = (head_dim, num_kv_heads, group_size, tile, kv_planes, value_dim)
    for row_multiple in (4, 8, 16, 32, 64):
        for kt_view in (True, False):
            if _rows_invariant(*shape, row_multiple, kt_view):
                return Numerics(row_multiple, kt_view, True)
    warnings.warn(
        "this machine's BLAS gave shape-dependent attention results for every setting tried; "
        "greedy outputs may differ across prefill/extend/decode splits",
        RuntimeWarning,
        stacklevel=2,
    )
    return Numerics(64, False, False)


def _rows_invariant(
    D: int,
    hkv: int,
    g: int,
    tile: int,
    planes: int,
    value_dim: int,
    row_multiple: int,
    kt_view: bool,
) -> bool:
    """One synthetic sequence as one chunk, as two chunks and as decode rows: equal bits?"""
    gen = torch.Generator().manual_seed(1234)
    bs = 16 if tile % 16 == 0 else tile
    ctx = max(2 * ROW_BLOCK // g, 2 * tile) + 5  # several row blocks and key tiles
    nblocks = -(-ctx // bs) + 2
    pool = torch.randn(nblocks, 1, planes, bs, hkv, D, generator=gen)
    q = torch.randn(ctx, hkv * g, D, generator=gen)
    table = list(range(nblocks - 1, -1, -1))  # not in order, like a real block table

    def run(spans: list[SeqSpan], rows: torch.Tensor) -> torch.Tensor:
        plan = plan_attention(
            spans,
            block_size=bs,
            num_layers=1,
            num_kv_heads=hkv,
            group_size=g,
            tile=tile,
            row_multiple=row_multiple,
            decode_kt_view=kt_view,
            kv_planes=planes,
            value_dim=value_dim,
        )
        return paged_attention_torch(rows, pool, 0, plan, 0.125)

    whole = run([SeqSpan(0, ctx, 0, table)], q)
    cut = tile + 3
    tail = run([SeqSpan(0, ctx - cut, cut, table)], q[cut:])
    if not torch.equal(tail, whole[cut:]):
        return False
    positions = [0, 1, tile - 1, tile, 2 * tile + 1, ctx - 1]
    spans = [SeqSpan(i, 1, p, table) for i, p in enumerate(positions)]
    dec = run(spans, q[positions])
    return torch.equal(dec, whole[positions])
