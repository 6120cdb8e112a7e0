"""Rotary embeddings as transformers computes them. The table grows in fixed 4096-position pages,
so a position's value never depends on which step first needed it (tails round differently)."""

from __future__ import annotations

import math

import torch

from pddflow.core.model_config import ModelConfig

PAGE = 4096


def inv_freq(config: ModelConfig) -> torch.Tensor:
    dim = config.head_dim
    base = config.rope_theta
    freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))
    rs = config.rope_scaling
    if rs.rope_type == "linear":
        return freq / rs.factor
    if rs.rope_type == "llama3":
        low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
        high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
        wavelen = 2 * math.pi / freq
        scaled = torch.where(wavelen > low_wavelen, freq / rs.factor, freq)
        smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
            rs.high_freq_factor - rs.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return freq


class Rope:
    def __init__(self, config: ModelConfig, device: torch.device, dtype: torch.dtype):
        self._inv_freq = inv_freq(config)
        self._device, self._dtype = device, dtype
        self._cos = torch.empty(0, config.head_dim, device=device, dtype=dtype)
        self._sin = torch.empty(0, config.head_dim, device=device, dtype=dtype)

    def _grow(self, n: int) -> None:
        cos, sin = [self._cos], [self._sin]
        have = self._cos.shape[0]
        while have < n:
            pos = torch.arange(have, have + PAGE, dtype=torch.int64).float()
            freqs = pos[:, None] * self._inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos.append(emb.cos().to(self._device, self._dtype))
            sin.append(emb.sin().to(self._device, self._dtype))
            have += PAGE
        self._cos, self._sin = torch.cat(cos), torch.cat(sin)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D], positions [T] (on x's device)."""
        need = int(positions.max()) + 1 if positions.numel() else 0
        if need > self._cos.shape[0]:
            self._grow(need)
        cos = self._cos[positions][:, None, :]
        sin = self._sin[positions][:, None, :]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin
