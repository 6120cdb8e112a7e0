"""Payload types: what flows along graph edges.

The names are what ports and channel kinds declare (checked by the validator). The dataclasses are
the in-memory form that operators produce and channels encode; each has exactly one wire form
(Arrow IPC for KVBlocks, protobuf for TokenIds and control), implemented in `pddflow.channels`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Payload(str, enum.Enum):
    REQUEST = "Request"  # prompt token IDs, sampling params, deadline
    KV_BLOCKS = "KVBlocks"  # a sequence's KV for a range of blocks
    TOKEN_IDS = "TokenIds"  # generated token IDs (the Extend-Decode handoff)
    TOKEN_STREAM = "TokenStream"  # tokens streamed to the client
    CONTROL = "Control"  # cancel / release / ack

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    deadline_s: float | None = None  # absolute time.monotonic() deadline; None = no deadline


@dataclass
class KVBlocks:
    """KV of `len(block_hashes)` consecutive blocks of one sequence.

    `data` is a contiguous tensor (torch or numpy) of shape
    [num_blocks, num_layers, 2 (K, V), block_size, num_kv_heads, head_dim]; block i covers token
    positions [token_start + i*block_size, token_start + (i+1)*block_size) except that the last block
    may be partial (`token_end` is exclusive). One block's slice `data[i]` is contiguous, which is
    what lets a channel ship, checksum and resume per block without copying.
    """

    seq_id: str
    block_hashes: list[int]
    token_start: int
    token_end: int
    block_size: int
    data: Any

    @property
    def num_blocks(self) -> int:
        return len(self.block_hashes)


@dataclass
class TokenIds:
    """Token IDs of one sequence at positions [start, start + len(ids))."""

    seq_id: str
    start: int
    ids: list[int]
    final: bool = False  # the sender will send no more IDs for this sequence
