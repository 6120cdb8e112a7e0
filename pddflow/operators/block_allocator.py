"""KV block allocator: a free list plus a reference count per block (the radix cache holds one,
each sequence reading the block another). Pure Python."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class KVCacheFull(RuntimeError):
    """A request needs more KV blocks than the cache can give right now (or ever)."""

    def __init__(
        self,
        needed: int,
        available: int,
        total: int,
        block_bytes: int | None = None,
        what: str = "",
    ):
        self.needed, self.available, self.total = needed, available, total
        size = ""
        if block_bytes:
            size = (
                f" ({needed * block_bytes / 2**20:.1f} MiB needed, "
                f"{total * block_bytes / 2**20:.1f} MiB budget)"
            )
        hint = (
            "it can never fit: raise the KV memory budget or shorten the request"
            if needed > total
            else "wait for running sequences to finish, or raise the KV memory budget"
        )
        super().__init__(
            f"KV cache full{(' for ' + what) if what else ''}: needs {needed} blocks, "
            f"{available} free of {total}{size}; {hint}"
        )


class BlockAllocator:
    def __init__(self, num_blocks: int):
        if num_blocks <= 0:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def refcount(self, block: int) -> int:
        return self._refs[block]

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise KVCacheFull(n, len(self._free), self.num_blocks)
        out = [self._free.popleft() for _ in range(n)]
        for b in out:
            self._refs[b] = 1
        return out

    def incref(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            if self._refs[b] <= 0:
                raise RuntimeError(f"incref on free block {b}")
            self._refs[b] += 1

    def decref(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            r = self._refs[b]
            if r <= 0:
                raise RuntimeError(f"double free of block {b}")
            self._refs[b] = r - 1
            if r == 1:
                self._free.append(b)
