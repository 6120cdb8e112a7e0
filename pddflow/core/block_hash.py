"""Prefix-chained block hashes (the Mooncake trace's `hash_ids` scheme), the one key of the engine's
radix cache, the router's mirrors and the simulator: equal hashes mean equal whole prefixes."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

# 64-bit hashes: collision odds are negligible at cache sizes of millions of blocks
DIGEST_BYTES = 8


def _hash(parent: bytes | None, data: bytes | memoryview) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    if parent is not None:
        h.update(parent)
    h.update(data)
    return h.digest()


def _parent_bytes(parent: int | None) -> bytes | None:
    return None if parent is None else parent.to_bytes(DIGEST_BYTES, "little")


def _digest(parent: int | None, tokens: Sequence[int]) -> int:
    data = struct.pack(f"<{len(tokens)}i", *tokens)
    return int.from_bytes(_hash(_parent_bytes(parent), data), "little")


def chain_block_hashes(
    token_ids: Sequence[int], block_size: int, parent: int | None = None
) -> list[int]:
    """Hashes of the full blocks of `token_ids` (a partial block's KV still grows: never shared).
    A cryptographic hash: a client must not be able to make its prompt's blocks collide with
    another's cached ones (why vLLM's prefix cache left Python's hash() for SHA-256)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    # the tokens packed once, each block hashed from a slice: the bytes _digest would hash
    data = memoryview(struct.pack(f"<{len(token_ids)}i", *token_ids))
    step, out = 4 * block_size, []
    digest = _parent_bytes(parent)
    for off in range(0, len(data) - step + 1, step):
        digest = _hash(digest, data[off : off + step])
        out.append(int.from_bytes(digest, "little"))
    return out


def partial_block_hash(token_ids: Sequence[int], parent: int | None = None) -> int:
    """Identifier of a trailing partial block in a KV transfer (never cached). It hashes fewer
    tokens than a full block, so it cannot equal a full block's hash input."""
    return _digest(parent, token_ids)
