"""Which prompt KV blocks travel to a decoder: one rule for the runtime and the simulator."""

from __future__ import annotations


def reused_blocks(cached_blocks: int, prompt_tokens: int, block_tokens: int) -> int:
    """Prefix blocks the receiver takes from its own cache. The block holding the prompt's last
    token always travels, so KV arrival is one event, never an empty transfer."""
    return max(0, min(cached_blocks, (prompt_tokens - 1) // block_tokens))
