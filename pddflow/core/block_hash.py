"""Prefix-chained block hashes: the one key scheme shared by the engine's radix cache, the router's
mirror of each MainDecode's cache, and the simulator.

A block's hash covers its own token IDs *and* its parent's hash, so equal hashes mean equal whole
prefixes, not just equal blocks. That is the scheme of the Mooncake trace's `hash_ids`, which lets a
trace replay and a live engine speak about the same cache contents. Pure Python (no torch): the
scheduler and the simulator import it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

# 64-bit hashes: collision odds are negligible at cache sizes of millions of blocks
DIGEST_BYTES = 8


def _digest(parent: int | None, tokens: Sequence[int]) -> int:
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    if parent is not None:
        h.update(parent.to_bytes(DIGEST_BYTES, "little"))
    h.update(struct.pack(f"<{len(tokens)}i", *tokens))
    return int.from_bytes(h.digest(), "little")


def chain_block_hashes(
    token_ids: Sequence[int], block_size: int, parent: int | None = None
) -> list[int]:
    """Hashes of the FULL blocks of `token_ids` (a trailing partial block gets none: its KV is still
    growing, so it cannot be shared). `parent` is the hash of the block just before `token_ids[0]`,
    which lets a caller hash a sequence incrementally as its blocks fill."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    out: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = _digest(parent, token_ids[start : start + block_size])
        out.append(parent)
    return out


def partial_block_hash(token_ids: Sequence[int], parent: int | None = None) -> int:
    """Identifier for a trailing partial block (shipped in KV transfers for checksums and resume,
    never inserted into a prefix cache). It hashes fewer tokens than a full block does, so its input
    differs from that of every full block with the same parent."""
    return _digest(parent, token_ids)
