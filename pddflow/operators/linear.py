"""Batch-invariant linear layers: an output row never depends on how many rows share the matmul
(docs/engine.md, Batch invariance). CUDA calls F.linear: no bit-exactness promised there."""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F


def _onednn_available() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available()) and hasattr(
            torch.ops.mkldnn, "_linear_pointwise"
        )
    except Exception:  # pragma: no cover - exotic builds
        return False


class Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, max_rows: int = 512):
        self.weight = weight.contiguous()
        self.bias = None if bias is None else bias.contiguous()
        self.out_features, self.in_features = weight.shape
        self._packed: torch.Tensor | None = None
        self.row_multiple = 1
        if weight.device.type == "cpu":
            mode, self.row_multiple = calibrate(
                self.in_features,
                self.out_features,
                bias is not None,
                _round_up(max_rows, 8),
                torch.get_num_threads(),
            )
            if mode == "onednn":
                self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.row_multiple == 1:
            return F.linear(x, self.weight, self.bias)
        m = x.shape[0]
        pad = _round_up(max(m, 1), self.row_multiple) - m
        if pad:
            x = F.pad(x, (0, 0, 0, pad))
        x = x.contiguous()
        if self._packed is not None:
            y = torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
        else:
            y = F.linear(x, self.weight, self.bias)
        return y[:m] if pad else y


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


@functools.cache
def calibrate(k: int, n: int, bias: bool, max_rows: int, num_threads: int) -> tuple[str, int]:
    """(backend, row padding) whose rows are bit-identical up to max_rows on this machine."""
    candidates = ([("onednn", 8), ("onednn", 16)] if _onednn_available() else []) + [
        ("blas", 16),
        ("blas", 32),
        ("blas", 64),
    ]
    for mode, mult in candidates:
        if _rows_invariant(k, n, bias, max_rows, mode, mult):
            return mode, mult
    warnings.warn(
        f"no batch-invariant matmul found for a {k}x{n} linear on this machine; greedy outputs "
        "may differ across prefill/extend/decode splits",
        RuntimeWarning,
        stacklevel=2,
    )
    return "blas", 64


def _rows_invariant(k: int, n: int, bias: bool, max_rows: int, mode: str, mult: int) -> bool:
    gen = torch.Generator().manual_seed(4321)
    w = torch.randn(n, k, generator=gen) * 0.05
    b = torch.randn(n, generator=gen) if bias else None
    big = _round_up(max(max_rows, 4 * mult), mult)
    x = torch.randn(big, k, generator=gen)
    if mode == "onednn":
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)

        def f(t: torch.Tensor) -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(t.contiguous(), packed, b, "none", [], "")
    else:

        def f(t: torch.Tensor) -> torch.Tensor:
            return F.linear(t.contiguous(), w, b)

    ref = f(x)
    sizes = sorted(
        {
            mult,
            2 * mult,
            3 * mult,
            5 * mult,
            8 * mult,
            16 * mult,
            _round_up(big // 2 + 1, mult),
            big,
        }
    )
    for m in sizes:
        if m > big:
            continue
        for start in (0, big - m):
            if not torch.equal(f(x[start : start + m]), ref[start : start + m]):
                return False
    return True
