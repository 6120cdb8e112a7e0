"""Incremental detokenization: the text of a growing output, piece by piece, at a cost per token
that does not grow with the output (re-decoding the whole output at every token cost 0.87 s per
4k tokens; benchmarks/detokenize.py). Whatever the pieces, their concatenation once `flush`ed is
exactly `tokenizer.decode(all ids)`, and a multi-byte character split across tokens is never
split across pieces.

- `ByteTokenizer`: an incremental UTF-8 decoder (`codecs`), the ids 0-255 being the bytes.
- Any other tokenizer (`HFTokenizer`'s `tokenizer.json`): vLLM's prefix-offset scheme over
  `decode` alone. A window of recent ids is decoded; the text past the decoded window prefix is
  new, and emitted once it does not end in U+FFFD (a character whose bytes are still coming).
  `tokenizers.decoders.DecodeStream` is the same scheme, but keeps no state to flush (an output
  ending inside a character loses its tail) and waits without bound behind invalid bytes; here a
  wait longer than `MAX_PENDING` ids emits up to the last clean boundary instead, so the window
  stays small whatever the ids.
"""

from __future__ import annotations

import codecs
from functools import partial
from typing import Protocol

from pddflow.operators.tokenizer import ByteTokenizer, Tokenizer

REPLACEMENT = "\ufffd"
MAX_PENDING = 4  # ids past the emitted text before a clean boundary is looked for


class Detokenizer(Protocol):
    def push(self, ids: list[int]) -> str:
        """The text these ids add that is final now (possibly "")."""
        ...

    def flush(self) -> str:
        """The rest, at the output's end (an incomplete character as U+FFFD, as decode does)."""
        ...


def detokenizer(tok: Tokenizer, skip_special_tokens: bool = True) -> Detokenizer:
    """A fresh incremental detokenizer for one output of `tok`; special tokens (EOS, ...) as
    text only with skip_special_tokens=False (vLLM's option)."""
    if isinstance(tok, ByteTokenizer):
        return ByteDetokenizer(skip_special_tokens)
    return WindowDetokenizer(tok, skip_special_tokens)


class ByteDetokenizer:
    """ByteTokenizer's ids: 0-255 are UTF-8 bytes; the rest (bos, eos, pad) decode to nothing, or
    (skip_special_tokens=False) to their text, as ByteTokenizer.decode has it."""

    def __init__(self, skip_special_tokens: bool = True) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._skip = skip_special_tokens

    def push(self, ids: list[int]) -> str:
        if self._skip:
            return self._dec.decode(bytes(i for i in ids if 0 <= i < 256))
        return ByteTokenizer.text_with_specials(ids, self._dec)

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class WindowDetokenizer:
    """The prefix-offset scheme over any `decode(ids) -> str`. `ids[prefix:read]` decodes to text
    already emitted (kept as context, so that decoders which look at neighbours, such as a
    leading-space rule, see the same tokens); `ids[read:]` is pending."""

    def __init__(self, tok: Tokenizer, skip_special_tokens: bool = True):
        self._decode = (
            tok.decode if skip_special_tokens else partial(tok.decode, skip_special_tokens=False)
        )
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._prefix_text = ""  # decode(ids[prefix:read])

    def push(self, ids: list[int]) -> str:
        out = []
        for i in ids:  # one id at a time: a chunk of many costs no more than its ids one by one
            self._ids.append(i)
            out.append(self._step())
        return "".join(out)

    def flush(self) -> str:
        text = self._decode(self._ids[self._prefix :])
        new = text[len(self._prefix_text) :]
        self._advance(len(self._ids))
        return new

    def _step(self) -> str:
        text = self._decode(self._ids[self._prefix :])
        if len(text) > len(self._prefix_text) and not text.endswith(REPLACEMENT):
            new = text[len(self._prefix_text) :]
            self._advance(len(self._ids))
            return new
        if len(self._ids) - self._read > MAX_PENDING:
            return self._force(text)
        return ""

    def _force(self, text: str) -> str:
        """Pending ids that keep ending in U+FFFD (invalid bytes, not one character still coming;
        or ids that decode to nothing): emit up to the latest boundary that splits no character,
        which no later id can change."""
        ids, p = self._ids, self._prefix
        for j in range(len(ids) - 1, self._read, -1):
            head, tail = self._decode(ids[p:j]), self._decode(ids[j:])
            # a character cut at j shows only once text follows it: with nothing after it (ids
            # that decode to nothing), head's last U+FFFD may be a character still coming
            if (tail or not head.endswith(REPLACEMENT)) and head + tail == text:
                new = head[len(self._prefix_text) :]
                self._advance(j)
                return new
        return ""

    def _advance(self, read: int) -> None:
        """ids[:read] are emitted: the old read offset becomes the window's start."""
        if read == self._read:
            return
        self._prefix, self._read = self._read, read
        self._prefix_text = self._decode(self._ids[self._prefix : self._read])
        if self._prefix > 4096:  # drop what no window can reach again
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
