"""The paged KV pool: one tensor, each block one contiguous slab (docs/engine.md, KV layout):
[blocks, layers, planes, block_size, KV heads, head_dim], the planes K and V, or latent attention's
one (the latent and the RoPE key of each token)."""

from __future__ import annotations

import math
import mmap

import torch

from pddflow.core.model_config import ModelConfig


def block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty(0, dtype=dtype).element_size()
    return config.kv_bytes_per_token(elem) * block_size


def blocks_for_budget(
    config: ModelConfig, block_size: int, dtype: torch.dtype, budget_bytes: int
) -> int:
    return int(budget_bytes) // block_bytes(config, block_size, dtype)


class KVPool:
    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.block_size = block_size
        shape = (
            num_blocks,
            config.num_layers,
            config.kv_planes,
            block_size,
            config.num_kv_heads,
            config.head_dim,
        )
        # zeros: never-written slots times a zero probability is zero only for finite values
        self.tensor = _zeros(shape, dtype, device)

    @property
    def num_blocks(self) -> int:
        return self.tensor.shape[0]

    def write(
        self,
        layer: int,
        k: torch.Tensor,
        v: torch.Tensor | None,
        slot_blocks: torch.Tensor,
        slot_offsets: torch.Tensor,
    ) -> None:
        """Store K/V [T, Hkv, D] of T tokens at (block, offset) slots (latent attention: its
        one plane as k, v None)."""
        self.tensor[slot_blocks, layer, 0, slot_offsets] = k.to(self.tensor.dtype)
        if v is not None:
            self.tensor[slot_blocks, layer, 1, slot_offsets] = v.to(self.tensor.dtype)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """On the CPU an anonymous mapping: the kernel zeroes each page when it is first touched, so
    a pool costs neither the time to clear it at start nor memory for blocks never used."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)
