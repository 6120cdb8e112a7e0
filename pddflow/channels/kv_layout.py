"""How a KV set sits in memory and in its wire metadata: block layout, zero-copy byte rows, token
ranges, hash words."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pddflow.channels.errors import ChannelError

U64_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class KVLayout:
    tensor_lib: str  # "torch" or "numpy"
    dtype: str  # torch dtype name ("bfloat16") or numpy dtype name ("float16")
    block_shape: tuple[int, ...]  # [num_layers, 2, block_size, num_kv_heads, head_dim]
    itemsize: int

    @property
    def block_bytes(self) -> int:
        return int(np.prod(self.block_shape, dtype=np.int64)) * self.itemsize

    @classmethod
    def of(cls, data: Any) -> KVLayout:
        if _is_torch(data):
            return cls(
                "torch",
                str(data.dtype).removeprefix("torch."),
                tuple(int(s) for s in data.shape[1:]),
                int(data.element_size()),
            )
        arr = np.asarray(data)
        return cls(
            "numpy", arr.dtype.name, tuple(int(s) for s in arr.shape[1:]), int(arr.dtype.itemsize)
        )

    def to_dict(self) -> dict:
        return {
            "tensor_lib": self.tensor_lib,
            "dtype": self.dtype,
            "block_shape": list(self.block_shape),
            "itemsize": self.itemsize,
        }

    @classmethod
    def from_dict(cls, d: dict) -> KVLayout:
        return cls(
            str(d["tensor_lib"]),
            str(d["dtype"]),
            tuple(int(x) for x in d["block_shape"]),
            int(d["itemsize"]),
        )

    def to_proto(self, pb: Any) -> Any:
        return pb.KVLayout(
            tensor_lib=self.tensor_lib,
            dtype=self.dtype,
            block_shape=list(self.block_shape),
            block_bytes=self.block_bytes,
        )

    @classmethod
    def from_proto(cls, msg: Any) -> KVLayout:
        shape = tuple(int(x) for x in msg.block_shape)
        elems = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if elems <= 0 or msg.block_bytes % elems:
            raise ChannelError(f"KV layout {shape} does not divide block_bytes={msg.block_bytes}")
        return cls(msg.tensor_lib, msg.dtype, shape, int(msg.block_bytes // elems))

    def empty(self, num_blocks: int, tensor_lib: str | None = None) -> Any:
        lib = tensor_lib or self.tensor_lib
        if lib == "torch":
            import torch

            return torch.empty((num_blocks, *self.block_shape), dtype=_torch_dtype(self.dtype))
        return np.empty((num_blocks, *self.block_shape), dtype=_numpy_dtype(self.dtype))

    def view(self, rows: np.ndarray, tensor_lib: str | None = None) -> Any:
        n = rows.shape[0]
        lib = tensor_lib or self.tensor_lib
        if lib == "torch":
            import torch

            # torch warns that Arrow's buffers are read-only; the view only reads them
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                t = torch.from_numpy(rows)
            return t.view(_torch_dtype(self.dtype)).reshape(n, *self.block_shape)
        return rows.view(_numpy_dtype(self.dtype)).reshape(n, *self.block_shape)


def _is_torch(data: Any) -> bool:
    # by module name, so numpy-only callers never import torch
    return type(data).__module__.startswith("torch") and hasattr(data, "element_size")


def _torch_dtype(name: str) -> Any:
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ChannelError(f"unknown torch dtype {name!r} in KV layout")
    return dt


def _numpy_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError as exc:
        raise ChannelError(
            f"dtype {name!r} has no numpy equivalent; send it as a torch tensor"
        ) from exc


def num_rows(data: Any) -> int:
    return int(data.shape[0])


def block_rows(data: Any) -> np.ndarray:
    """data as uint8 [num_blocks, block_bytes], no copy (an accelerator tensor is staged once). A
    non-contiguous tensor is refused: a silent copy of a multi-GB KV set is a bug."""
    if _is_torch(data):
        t = data.detach()
        if t.device.type != "cpu":
            t = t.contiguous().cpu()
        if not t.is_contiguous():
            raise ChannelError(
                "KVBlocks.data must be contiguous (call .contiguous() on the producer side)"
            )
        import torch

        n = t.shape[0]
        per = int(np.prod(t.shape[1:], dtype=np.int64)) * t.element_size()
        return t.reshape(-1).view(torch.uint8).numpy().reshape(n, per)
    arr = np.asarray(data)
    if not arr.flags.c_contiguous:
        raise ChannelError(
            "KVBlocks.data must be C-contiguous (np.ascontiguousarray on the producer side)"
        )
    n = arr.shape[0]
    per = int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.dtype.itemsize
    return arr.reshape(-1).view(np.uint8).reshape(n, per)


def token_range(i: int, token_start: int, token_end: int, block_size: int) -> tuple[int, int]:
    lo = token_start + i * block_size
    return lo, min(token_end, lo + block_size)


def hash_bits(hashes: Sequence[int]) -> tuple[np.ndarray, bool]:
    signed = any(h < 0 for h in hashes)
    for h in hashes:
        if not (-(1 << 63) <= h <= U64_MASK) or (signed and h > (1 << 63) - 1):
            raise ChannelError(
                f"block hash {h} does not fit 64 bits (signed and unsigned hashes mixed?)"
            )
    return np.array([h & U64_MASK for h in hashes], dtype=np.uint64), signed


def hashes_from_bits(bits: np.ndarray, signed: bool) -> list[int]:
    words = bits.astype(np.uint64)
    return words.view(np.int64).tolist() if signed else words.tolist()
