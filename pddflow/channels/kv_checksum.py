"""Per-block checksums (xsum64, crc32: docs/channels.md) over the block's metadata words, then its
K/V bytes, so a block moved to another index or given another hash fails too."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np

from pddflow.channels.errors import ChannelError
from pddflow.channels.kv_layout import U64_MASK

_ROW_META = struct.Struct("<QQQQ")  # block_index, block_hash bits, token_start, token_end

Meta = tuple[int, int, int, int]


def _crc32(meta: Meta, kv: Any) -> int:
    return zlib.crc32(kv, zlib.crc32(_ROW_META.pack(*meta)))  # zlib drops the GIL on large buffers


_WEIGHTS: dict[int, np.ndarray] = {}


def _weights(n: int) -> np.ndarray:
    """The first n odd weights (xsum64: sum of (2k + 1) x word_k mod 2^64)."""
    w = _WEIGHTS.get(n)
    if w is None:
        if len(_WEIGHTS) > 8:
            _WEIGHTS.clear()
        w = _WEIGHTS[n] = np.arange(1, 2 * n, 2, dtype=np.uint64)
    return w


def _xsum64(meta: Meta, kv: Any) -> int:
    b = kv if isinstance(kv, np.ndarray) else np.frombuffer(kv, dtype=np.uint8)
    b = b.reshape(-1)
    n_words = b.shape[0] // 8
    tail = b[n_words * 8 :]
    w = _weights(4 + n_words + (1 if tail.shape[0] else 0))
    total = int(np.dot(b[: n_words * 8].view(np.uint64), w[4 : 4 + n_words])) if n_words else 0
    for k, m in enumerate(meta):
        total += (m & U64_MASK) * int(w[k])
    if tail.shape[0]:
        total += int.from_bytes(tail.tobytes().ljust(8, b"\0"), "little") * int(w[-1])
    return total & U64_MASK


CHECKSUMS = {"xsum64": _xsum64, "crc32": _crc32}
DEFAULT_CHECKSUM = "xsum64"


def check_algorithm(name: str) -> str:
    if name not in CHECKSUMS:
        raise ChannelError(f"unknown checksum {name!r}; valid: {', '.join(sorted(CHECKSUMS))}")
    return name


def block_checksum(
    algorithm: str, index: int, hash_word: int, token_start: int, token_end: int, kv: Any
) -> int:
    meta = (index, hash_word, token_start & U64_MASK, token_end & U64_MASK)
    return CHECKSUMS[algorithm](meta, kv)
