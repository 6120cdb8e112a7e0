"""Rotary embeddings as transformers computes them (default, linear, llama3 and YaRN scaling; the
rotate-half layout, or DeepSeek's interleaved pairs). The table grows in fixed 4096-position
pages, so a position's value never depends on which step first needed it (tails round
differently)."""

from __future__ import annotations

import math

import torch

from pddflow.core.model_config import ModelConfig

PAGE = 4096


def inv_freq(config: ModelConfig) -> torch.Tensor:
    dim = config.rope_dim
    base = config.rope_theta
    freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))
    rs = config.rope_scaling
    if rs.rope_type == "yarn":
        return _yarn_inv_freq(config)
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


def _yarn_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Frequencies interpolated by `factor` below the correction range, kept above it, ramped
    between (YaRN, as transformers' _compute_yarn_parameters)."""
    rs, dim, base = config.rope_scaling, config.rope_dim, config.rope_theta

    def correction_dim(rotations: float) -> float:
        ctx = rs.original_max_position_embeddings
        return (dim * math.log(ctx / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rs.beta_fast), correction_dim(rs.beta_slow)
    if rs.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    interpolated = 1.0 / (rs.factor * pos_freqs)
    return interpolated * (1 - keep) + (1.0 / pos_freqs) * keep


class Rope:
    def __init__(self, config: ModelConfig, device: torch.device, dtype: torch.dtype):
        self._inv_freq = inv_freq(config)
        rs = config.rope_scaling
        # YaRN scales cos and sin (1 unless mscale and mscale_all_dim differ)
        self._scale = rs.yarn_attention_factor() if rs.rope_type == "yarn" else 1.0
        self._interleave = config.rope_interleave
        self._device, self._dtype = device, dtype
        self._cos = torch.empty(0, config.rope_dim, device=device, dtype=dtype)
        self._sin = torch.empty(0, config.rope_dim, device=device, dtype=dtype)

    def _grow(self, n: int) -> None:
        cos, sin = [self._cos], [self._sin]
        have = self._cos.shape[0]
        while have < n:
            pos = torch.arange(have, have + PAGE, dtype=torch.int64).float()
            freqs = pos[:, None] * self._inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos.append((emb.cos() * self._scale).to(self._device, self._dtype))
            sin.append((emb.sin() * self._scale).to(self._device, self._dtype))
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
        if self._interleave:
            # pairs (x0, x1), (x2, x3)... each turned by one angle; the result de-interleaved,
            # the same permutation for queries and keys, so their products are unchanged
            cos, sin = cos[..., :half], sin[..., :half]
            even, odd = x[..., 0::2], x[..., 1::2]
            return torch.cat([even * cos - odd * sin, odd * cos + even * sin], dim=-1)
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin
