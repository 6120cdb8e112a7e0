"""Triton KV block gather/scatter (CUDA; also runs under TRITON_INTERPRET=1 for tests)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_CHUNK = 1024


@triton.jit
def _gather_kernel(pool_ptr, ids_ptr, out_ptr, slab, CHUNK: tl.constexpr):
    i = tl.program_id(0)
    c = tl.program_id(1)
    b = tl.load(ids_ptr + i).to(tl.int64)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    m = offs < slab
    x = tl.load(pool_ptr + b * slab + offs, mask=m)
    tl.store(out_ptr + i.to(tl.int64) * slab + offs, x, mask=m)


@triton.jit
def _scatter_kernel(pool_ptr, ids_ptr, data_ptr, slab, CHUNK: tl.constexpr):
    i = tl.program_id(0)
    c = tl.program_id(1)
    b = tl.load(ids_ptr + i).to(tl.int64)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    m = offs < slab
    x = tl.load(data_ptr + i.to(tl.int64) * slab + offs, mask=m)
    tl.store(pool_ptr + b * slab + offs, x, mask=m)


def _slab(pool: torch.Tensor) -> int:
    if not pool.is_contiguous():
        raise ValueError("the KV pool must be contiguous")
    return pool[0].numel()


def gather_blocks_triton(pool: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    slab = _slab(pool)
    out = torch.empty((ids.numel(), *pool.shape[1:]), dtype=pool.dtype, device=pool.device)
    grid = (ids.numel(), triton.cdiv(slab, _CHUNK))
    _gather_kernel[grid](pool, ids, out, slab, CHUNK=_CHUNK)
    return out


def scatter_blocks_triton(pool: torch.Tensor, ids: torch.Tensor, data: torch.Tensor) -> None:
    slab = _slab(pool)
    grid = (ids.numel(), triton.cdiv(slab, _CHUNK))
    _scatter_kernel[grid](pool, ids, data, slab, CHUNK=_CHUNK)
