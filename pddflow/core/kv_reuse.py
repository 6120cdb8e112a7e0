"""Which KV blocks of a prompt travel to a decoder: the one rule the runtime's prefill worker, its
decoders and the simulator share."""

from __future__ import annotations


def reused_blocks(cached_blocks: int, prompt_tokens: int, block_tokens: int) -> int:
    """Prefix blocks the receiver takes from its own cache; the sender ships the rest.

    At least the block holding the prompt's last token always travels, so the receiver's KV
    arrival is one event, never an empty transfer."""
    return max(0, min(cached_blocks, (prompt_tokens - 1) // block_tokens))
