"""Payload types along graph edges and their in-memory form (wire forms: `pddflow.channels`)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


class Payload(enum.StrEnum):
    REQUEST = "Request"
    KV_BLOCKS = "KVBlocks"
    TOKEN_IDS = "TokenIds"  # generated token IDs (the Extend-Decode handoff)
    TOKEN_STREAM = "TokenStream"
    CONTROL = "Control"  # cancel / release / ack


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    # vLLM's: no stop token (nor stop string) ends the output before it has this many tokens
    min_tokens: int = 0
    # None: no log probabilities (nothing computed); k >= 0: each sampled token's logprob and the
    # k most likely tokens' (log-softmax of the raw logits, at temperature 1)
    logprobs: int | None = None
    # OpenAI's: subtract frequency * count + presence * (count > 0) of each token generated so far
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # vLLM's: a token seen in the prompt or the output has its logit divided by this (> 0) when
    # positive, multiplied when negative; 1 = off
    repetition_penalty: float = 1.0
    top_k: int = 0  # keep the k most likely tokens; 0 = all
    min_p: float = 0.0  # keep tokens at least min_p times as likely as the most likely; 0 = all
    # structured output: the grammar (llguidance's text) every token must keep the output in
    grammar: str | None = None

    @property
    def penalized(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty) or (
            self.repetition_penalty != 1.0
        )


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log probability and the k most likely tokens' (most likely first)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class TokenChunk(list):
    """Token IDs streamed to the client, with their log probabilities (None where not asked): a
    list still, so a router that reports none can yield plain lists."""

    def __init__(
        self,
        ids: Sequence[int],
        logprobs: list[TokenLogprob | None] | None = None,
        finish_reason: str | None = None,
    ):
        super().__init__(ids)
        self.logprobs = logprobs
        self.finish_reason = finish_reason  # on the stream's last chunk: the worker's reason


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    deadline_s: float | None = None  # absolute time.monotonic() deadline; None = no deadline


@dataclass(frozen=True)
class FirstToken:
    """What prefill computed beside the prompt's KV, carried with it to the decoders: the first
    generated token, its log probability when the request asked, and the prompt tokens prefill's
    prefix cache gave (what the answer's usage reports as cached)."""

    token: int
    logprob: TokenLogprob | None = None
    cached_tokens: int = 0


@dataclass
class KVBlocks:
    """KV of blocks [token_start, token_end) of one sequence, the last maybe partial. `data`:
    [num_blocks, num_layers, 2 (K, V), block_size, num_kv_heads, head_dim], contiguous per block."""

    seq_id: str
    block_hashes: list[int]
    token_start: int
    token_end: int
    block_size: int
    data: Any
    # the KV heads [a, b) of the model's that `data` holds: one tensor-parallel rank's shard on
    # its way rank to rank; None: every head
    heads: tuple[int, int] | None = None
    first: FirstToken | None = None  # prefill's first token, with the KV it belongs to

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
