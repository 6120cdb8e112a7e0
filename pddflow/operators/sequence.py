"""A sequence. Invariant: the KV of token_ids[:num_computed] is in the pool, in block_table order;
later tokens are known but pending."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pddflow.core.block_hash import chain_block_hashes
from pddflow.core.payloads import SamplingParams, TokenLogprob


@dataclass(eq=False)
class Sequence:
    seq_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling: SamplingParams
    seed: int  # draws are a function of (seed, position): the same on any worker
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    finished: bool = False
    finish_reason: str | None = None  # "length" | "stop" | GRAMMAR_DEAD_END
    # (logprob, top [(id, logprob)...]) of each token this engine sampled, in order, when
    # sampling.logprobs asks (tokens handed in by another worker have none here)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # where the request's output begins in token_ids, when not at num_prompt_tokens (a leg resumed
    # elsewhere prefills the output already streamed with the prompt)
    output_start: int | None = None
    grammar: Any = None  # structured output: the grammar's state (operators/grammar.py)
    _hashes: list[int] = field(default_factory=list, repr=False)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def generated_ids(self) -> list[int]:
        """The request's output so far (what frequency and presence penalties count)."""
        start = self.num_prompt_tokens if self.output_start is None else self.output_start
        return self.token_ids[start:]

    @property
    def num_pending(self) -> int:
        return len(self.token_ids) - self.num_computed

    def block_hashes(self, block_size: int, upto_tokens: int | None = None) -> list[int]:
        """Chained hashes of the full blocks within token_ids[:upto_tokens] (computed once)."""
        n = len(self.token_ids) if upto_tokens is None else upto_tokens
        want = n // block_size
        have = len(self._hashes)
        if want > have:
            parent = self._hashes[-1] if have else None
            self._hashes += chain_block_hashes(
                self.token_ids[have * block_size : want * block_size], block_size, parent
            )
        return self._hashes[:want]
