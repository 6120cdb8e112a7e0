"""Tokenizers (bytes for builtin, `tokenizer.json` for checkpoints), needed only for text I/O."""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Protocol


class Tokenizer(Protocol):
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are IDs 0-255; 256 <bos>, 257 <eos>, 258 <pad>."""

    BOS, EOS, PAD = 256, 257, 258
    vocab_size = 259
    eos_token_ids = (EOS,)
    SPECIAL_TEXT = {BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}  # skip_special_tokens=False

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # <bos> has no text form a template could write, so it is always added
        return [self.BOS, *text.encode("utf-8")]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens:
            return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return self.text_with_specials(ids, dec) + dec.decode(b"", final=True)

    @classmethod
    def text_with_specials(cls, ids: list[int], dec: codecs.IncrementalDecoder) -> str:
        """ids' text through the UTF-8 decoder `dec`, each special id as its text; a character
        cut short before a special ends there (U+FFFD), as each run of bytes decodes on its own."""
        out, run = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
            elif i in cls.SPECIAL_TEXT:
                out += [dec.decode(bytes(run), final=True), cls.SPECIAL_TEXT[i]]
                run = bytearray()
        return "".join(out) + dec.decode(bytes(run))

    def token_bytes(self, token_id: int) -> bytes:
        """One id's raw bytes (a lone id may be part of a UTF-8 character; special ids: none)."""
        return bytes([token_id]) if 0 <= token_id < 256 else b""


class HFTokenizer:
    """A `tokenizer.json` through the `tokenizers` library (no transformers import at run time)."""

    def __init__(self, path: Path, eos_token_ids: tuple[int, ...] = ()):
        from tokenizers import Tokenizer as _Tok

        self._tok = _Tok.from_file(str(path))
        self.path = Path(path)  # what a grammar engine reads the vocabulary from
        self.eos_token_ids = eos_token_ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
