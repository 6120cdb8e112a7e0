"""Structured output at the API: `response_format` -> the grammar every decoding worker applies
(operators/grammar.py), compiled here once per grammar text (cached) so that a schema the grammar
engine refuses is a 400 naming it, before any worker sees the request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pddflow.operators.grammar import Grammars, json_schema_grammar
from pddflow.runtime.api.schema import FieldError, ResponseFormat


class ResponseGrammars:
    def __init__(self, tokenizer: Any, vocab_size: int):
        self._tokenizer = tokenizer
        self._vocab = max(vocab_size, getattr(tokenizer, "vocab_size", 0))
        self._grammars: Grammars | None = None

    def grammar(self, fmt: ResponseFormat | None) -> str | None:
        """The grammar text of a response format (None: plain text); FieldError when its schema
        does not compile."""
        if fmt is None or fmt.type == "text":
            return None
        where = "response_format"
        schema = None
        if fmt.type == "json_schema":
            assert fmt.json_schema is not None
            where, schema = "response_format.json_schema.schema", fmt.json_schema.json_schema
            if schema is None:  # OpenAI: a schema-less json_schema is any JSON object
                where = "response_format.json_schema"
        return self.checked(lambda: json_schema_grammar(schema), where)

    def checked(self, build: Callable[[], str | None], where: str) -> str | None:
        """build()'s grammar once it compiles; FieldError naming `where` when it does not."""
        try:
            if self._grammars is None:
                self._grammars = Grammars(self._tokenizer, self._vocab)
            text = build()
            if text is not None:
                self._grammars.check(text)
        except ValueError as exc:
            raise FieldError(where, str(exc)) from None
        return text
