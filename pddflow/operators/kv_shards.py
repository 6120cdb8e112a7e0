"""Which KV heads each tensor-parallel rank holds, and how KV moves rank to rank between two
instances whose degrees differ (docs/engine.md, KV across layouts). Pure functions of head counts.

A rank of `size` holds a contiguous range of the model's KV heads: its share while there are at
least as many heads as ranks, else one head that `size / num_kv_heads` consecutive ranks share.
"""

from __future__ import annotations

from dataclasses import dataclass


def kv_heads(num_kv_heads: int, size: int, rank: int) -> tuple[int, int]:
    """The KV heads [a, b) of rank `rank` of `size` (a layout `check_layout` accepted)."""
    if size <= num_kv_heads:
        n = num_kv_heads // size
        return rank * n, (rank + 1) * n
    head = rank // (size // num_kv_heads)
    return head, head + 1


def kv_owners(num_kv_heads: int, size: int) -> list[int]:
    """The ranks that between them hold every KV head once, in head order: the first of the ranks
    sharing a head, where ranks outnumber heads."""
    if size <= num_kv_heads:
        return list(range(size))
    return [j * (size // num_kv_heads) for j in range(num_kv_heads)]


@dataclass(frozen=True)
class HeadRoute:
    """Heads [lo, hi) go from rank `src` of the sending instance to rank `dst` of the receiving."""

    src: int
    dst: int
    lo: int
    hi: int


def head_routes(num_kv_heads: int, src_size: int, dst_size: int) -> list[HeadRoute]:
    """Every receiving rank gets exactly its heads, each from the one sending rank that owns them
    (a head two sending ranks share is sent once); a head two receiving ranks share goes to both.
    Ordered by receiving rank, then head."""
    routes = []
    for dst in range(dst_size):
        a, b = kv_heads(num_kv_heads, dst_size, dst)
        for src in kv_owners(num_kv_heads, src_size):
            c, d = kv_heads(num_kv_heads, src_size, src)
            lo, hi = max(a, c), min(b, d)
            if lo < hi:
                routes.append(HeadRoute(src, dst, lo, hi))
    return routes
