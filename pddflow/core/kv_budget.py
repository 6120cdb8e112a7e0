"""Does a request's KV fit: the blocks a number of tokens occupies at a block size, and whether a
request's worst case (its prompt and every token max_tokens allows) fits a pool of N blocks.

One arithmetic for every place that asks: the colocated reference's admission
(`operators/continuous_batching.py`), a decoder's wait for memory, and the frontend's refusal of
a request no instance on its route could ever hold. Pure: no torch, no engine.
"""

from __future__ import annotations

from dataclasses import dataclass


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks that hold `tokens` positions (a partial last block takes a whole one)."""
    return -(-max(tokens, 0) // block_size)


@dataclass(frozen=True)
class KVFit:
    """A request's worst case against one pool; `kv_fit` builds it."""

    prompt_tokens: int
    max_tokens: int  # as the request asked (the message quotes it)
    block_size: int
    pool_blocks: int  # blocks the pool holds in all, free or not
    blocks: int  # blocks the request holds at its worst on this pool

    @property
    def fits(self) -> bool:
        """Whether the pool could ever hold it (when nothing else is running)."""
        return self.blocks <= self.pool_blocks

    def refusal(self, instance: str) -> str:
        """Why it can never fit on `instance`, in the words a client reads."""
        return (
            f"the prompt ({self.prompt_tokens} tokens) and max_tokens ({self.max_tokens}) need "
            f"{self.blocks} KV blocks on {instance}, which holds {self.pool_blocks} "
            f"({self.pool_blocks * self.block_size} tokens); lower max_tokens or shorten the prompt"
        )


def kv_fit(
    prompt_tokens: int,
    max_tokens: int,
    block_size: int,
    pool_blocks: int,
    *,
    holds_output: bool = True,
) -> KVFit:
    """The blocks a request holds at its worst and whether `pool_blocks` could hold them.

    holds_output=False: the pool keeps the prompt only (a prefill instance hands the output to a
    decoder); otherwise the prompt plus max_tokens (a negative max_tokens counts as none)."""
    tokens = prompt_tokens + (max(max_tokens, 0) if holds_output else 0)
    return KVFit(prompt_tokens, max_tokens, block_size, pool_blocks, blocks_for(tokens, block_size))
