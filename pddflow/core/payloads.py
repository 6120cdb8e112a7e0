"""Payload types: what flows along graph edges.

The names are what ports and channel kinds declare; the dataclasses are the in-memory form, each
with one wire form in `pddflow.channels` (Arrow IPC for KVBlocks, protobuf for the rest).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Payload(enum.StrEnum):
    REQUEST = "Request"  # prompt token IDs, sampling params, deadline
    KV_BLOCKS = "KVBlocks"
    TOKEN_IDS = "TokenIds"  # generated token IDs (the Extend-Decode handoff)
    TOKEN_STREAM = "TokenStream"  # tokens streamed to the client
    CONTROL = "Control"  # cancel / release / ack


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
    """KV of consecutive blocks [token_start, token_end) of one sequence; the last may be partial.

    `data`: a contiguous torch or numpy array [num_blocks, num_layers, 2 (K, V), block_size,
    num_kv_heads, head_dim]. Each `data[i]` is contiguous, so a channel ships, checksums and resumes
    per block without copying.
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
