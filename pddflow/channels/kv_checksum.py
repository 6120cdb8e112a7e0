"""Per-block checksums of the KV wire form. Each covers the block's metadata words (index, hash,
token_start, token_end) first, then its K/V bytes, so a block moved to another index or given
another hash fails too.

    xsum64  sum of w_k * word_k mod 2^64 over the little-endian 64-bit words, w_k = 2k + 1. Odd
            weights make every error inside one word, and every burst of up to 64 bits, change
            the sum; a random error goes unnoticed with probability 2^-64. numpy computes it at
            memory speed, faster than zlib's CRC-32, so it is the default.
    crc32   zlib CRC-32: the classic, slower; bursts up to 32 bits always caught, random errors
            missed with probability 2^-32.
"""

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
    """The first n odd weights, cached for the few block sizes a process sees."""
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
    """Checksum of one block's row: its metadata, then its K/V bytes."""
    meta = (index, hash_word, token_start & U64_MASK, token_end & U64_MASK)
    return CHECKSUMS[algorithm](meta, kv)
