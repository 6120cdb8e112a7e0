"""Structured output: a grammar's token mask applied in the sampler (docs/openai-api.md, Structured
outputs). The grammar engine is llguidance: an Earley parser over the tokenizer's byte vocabulary
that computes each step's mask lazily, with no per-schema ahead-of-time compile (a new schema
costs its first mask, not seconds of compilation).

A sequence's matcher state is a function of its output tokens alone, so every decoding worker
rebuilds it from the token IDs it holds (the relay's, handed to main) before each draw: nothing
but the grammar's text crosses a handoff.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np


def grammar_engine() -> Any:
    try:
        import llguidance
    except ImportError as exc:  # a dependency: only a broken install lacks it
        raise RuntimeError("structured output needs llguidance (pip install llguidance)") from exc
    return llguidance


def json_schema_grammar(schema: dict[str, Any] | None) -> str:
    """The grammar of JSON values a schema accepts (None: any JSON object), compact (no
    whitespace between tokens: a model's whitespace cannot run away with the budget)."""
    lg = grammar_engine()
    body = dict(schema) if schema is not None else {"type": "object"}
    body.setdefault("x-guidance", {"whitespace_flexible": False})
    return lg.grammar_from("json_schema", json.dumps(body))


def ll_tokenizer(tokenizer: Any, vocab_size: int) -> Any:
    """The grammar engine's view of a tokenizer: each token ID's bytes, and the EOS IDs."""
    lg = grammar_engine()
    eos = list(tokenizer.eos_token_ids)
    path = getattr(tokenizer, "path", None)
    if path is not None:  # a tokenizer.json: llguidance reads its byte-level vocabulary
        return lg.LLTokenizer(str(path), n_vocab=vocab_size, eos_token=eos)
    if not hasattr(tokenizer, "token_bytes"):
        raise ValueError(
            f"structured output needs the bytes of every token ID, which this tokenizer "
            f"({type(tokenizer).__name__}) does not name"
        )
    vocab = lg.TokenizerWrapper(_ByteVocab(tokenizer, vocab_size))
    return lg.LLTokenizer(vocab, n_vocab=vocab_size)


class _ByteVocab:
    """What llguidance's TokenizerWrapper reads from a tokenizer that can name each ID's bytes
    (the built-in byte tokenizer)."""

    def __init__(self, tokenizer: Any, vocab_size: int):
        self._tok = tokenizer
        self.eos_token_id = tokenizer.eos_token_ids[0]
        self.bos_token_id = getattr(tokenizer, "BOS", None)
        self.tokens = [tokenizer.token_bytes(i) or f"<{i}>".encode() for i in range(vocab_size)]
        self.special_token_ids = [i for i in range(vocab_size) if not tokenizer.token_bytes(i)]

    def __call__(self, text: str | bytes) -> list[int]:
        s = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
        ids = self._tok.encode(s)
        return ids[1:] if ids and ids[0] == self.bos_token_id else ids


class Grammars:
    """One engine's grammars: the tokenizer view built once, each grammar's matcher compiled once
    (cached by its text) and copied for each sequence."""

    def __init__(self, tokenizer: Any, vocab_size: int):
        self.vocab_size = vocab_size
        try:
            self._ll = ll_tokenizer(tokenizer, vocab_size)
        except (ValueError, RuntimeError, TypeError) as exc:
            raise ValueError(
                f"structured output: the grammar engine cannot read this model's tokenizer ({exc})"
            ) from None
        self._only_eos = np.zeros(vocab_size, dtype=bool)
        self._only_eos[list(tokenizer.eos_token_ids)] = True
        self._compiled = lru_cache(maxsize=64)(self._compile)

    def _compile(self, grammar: str) -> Any:
        lg = grammar_engine()
        matcher = lg.LLMatcher(self._ll, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"the grammar does not compile: {matcher.get_error()}")
        return matcher

    def check(self, grammar: str) -> None:
        """ValueError naming the problem when `grammar` does not compile."""
        self._compiled(grammar)

    def state(self, grammar: str) -> GrammarState:
        return GrammarState(self._compiled(grammar).deep_copy(), 0)

    def mask(self, state: GrammarState, generated: list[int]) -> np.ndarray:
        """Bool [vocab]: the tokens the grammar allows after `generated` (the sequence's output
        so far; the state consumes what it has not seen yet). Only EOS where the grammar allows
        nothing more (it is complete) or nothing at all: a dead end (the vocabulary has no token
        the grammar would take next), which marks the state `dead` and ends the answer there.
        Numpy, not torch: the API process checks grammars and must not pay torch's import."""
        m = state.matcher
        if state.consumed < len(generated):
            m.consume_tokens(generated[state.consumed :])
            state.consumed = len(generated)
        only_eos = self._only_eos
        if not m.is_error():
            bits = np.frombuffer(m.compute_bitmask(), dtype=np.uint8)
            allowed = np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool)
            # llguidance offers EOS where its lexer is stuck too: only EOS is a dead end unless
            # the grammar is complete
            if (allowed & ~only_eos).any() or (allowed.any() and m.is_accepting()):
                return allowed
        state.dead = True
        return only_eos


@dataclass
class GrammarState:
    matcher: Any
    consumed: int  # output tokens the matcher has seen
    dead: bool = False  # the grammar admits no token of this vocabulary: the answer is cut short


# a sequence whose grammar dead-ended: its output is incomplete (never `stop`, which promises a
# complete answer)
GRAMMAR_DEAD_END = "grammar_dead_end"
