"""KV block gather/scatter, the device side of KV export and import: one copy each way."""

from __future__ import annotations

import torch


def gather_blocks(pool: torch.Tensor, block_ids: list[int] | torch.Tensor) -> torch.Tensor:
    ids = torch.as_tensor(block_ids, dtype=torch.long, device=pool.device)
    if pool.device.type == "cuda" and ids.numel():
        from pddflow.kernels._triton_kv_copy import gather_blocks_triton

        return gather_blocks_triton(pool, ids)
    return gather_blocks_torch(pool, ids)


def scatter_blocks(
    pool: torch.Tensor, block_ids: list[int] | torch.Tensor, data: torch.Tensor
) -> None:
    """pool[block_ids[i]] = data[i] (data may live on another device or in another dtype)."""
    ids = torch.as_tensor(block_ids, dtype=torch.long, device=pool.device)
    if tuple(data.shape[1:]) != tuple(pool.shape[1:]) or data.shape[0] != ids.numel():
        raise ValueError(
            f"KV data of shape {tuple(data.shape)} does not fit {ids.numel()} blocks of "
            f"shape {tuple(pool.shape[1:])}"
        )
    data = data.to(device=pool.device, dtype=pool.dtype)
    if pool.device.type == "cuda" and ids.numel():
        from pddflow.kernels._triton_kv_copy import scatter_blocks_triton

        scatter_blocks_triton(pool, ids, data.contiguous())
        return
    scatter_blocks_torch(pool, ids, data)


def gather_blocks_torch(pool: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return pool.index_select(0, ids)


def scatter_blocks_torch(pool: torch.Tensor, ids: torch.Tensor, data: torch.Tensor) -> None:
    pool.index_copy_(0, ids, data)
