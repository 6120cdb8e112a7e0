"""Per-block checksums (xxh3_64, crc32: docs/channels.md) over the block's metadata words, then its
K/V bytes, so a block moved to another index or given another hash fails too."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import xxhash

from pddflow.channels.errors import ChannelError
from pddflow.channels.kv_layout import U64_MASK

_ROW_META = struct.Struct("<QQQQ")  # block_index, block_hash bits, token_start, token_end

Meta = tuple[int, int, int, int]


def _crc32(meta: Meta, kv: Any) -> int:
    return zlib.crc32(kv, zlib.crc32(_ROW_META.pack(*meta)))  # zlib drops the GIL on large buffers


def _xxh3_64(meta: Meta, kv: Any) -> int:
    """XXH3-64 (seed 0) of the 32 metadata bytes followed by the K/V bytes."""
    h = xxhash.xxh3_64(_ROW_META.pack(*meta))
    h.update(kv)  # any C-contiguous buffer: block rows always are (kv_layout.block_rows)
    return h.intdigest()


CHECKSUMS = {"xxh3_64": _xxh3_64, "crc32": _crc32}  # the names graphs may use: CHECKSUM_ALGORITHMS
DEFAULT_CHECKSUM = "xxh3_64"


def check_algorithm(name: str) -> str:
    if name not in CHECKSUMS:
        raise ChannelError(f"unknown checksum {name!r}; valid: {', '.join(sorted(CHECKSUMS))}")
    return name


def block_checksum(
    algorithm: str, index: int, hash_word: int, token_start: int, token_end: int, kv: Any
) -> int:
    meta = (index, hash_word, token_start & U64_MASK, token_end & U64_MASK)
    return CHECKSUMS[algorithm](meta, kv)
