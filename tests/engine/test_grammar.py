"""Structured output in the engine: a JSON schema's grammar masks every draw, so even a random
model's answer parses and validates (the built-in byte tokenizer, and a byte-level BPE
tokenizer.json read by the grammar engine); the grammar state rebuilt from the output tokens
alone (what main does after a handoff) gives the masks of the one that followed every draw."""

from __future__ import annotations

import json

import pytest

from pddflow.core.payloads import SamplingParams
from pddflow.operators.engine import Engine
from pddflow.operators.grammar import json_schema_grammar

jsonschema = pytest.importorskip("jsonschema")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_spec("builtin:tiny-llama")


def _answer(engine: Engine, prompt: str, schema, **sampling) -> tuple[str, str]:
    eos = tuple(engine.tokenizer.eos_token_ids)
    params = SamplingParams(
        max_tokens=120, stop_token_ids=eos, grammar=json_schema_grammar(schema), **sampling
    )
    seq = engine.generate([engine.tokenizer.encode(prompt)], params)[0]
    return engine.tokenizer.decode(seq.output_ids), seq.finish_reason


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 4}], ids=["greedy", "t1"])
def test_a_random_models_answer_follows_the_schema(engine, sampling):
    text, finish = _answer(engine, "A person, as JSON: ", PERSON, **sampling)
    assert finish == "stop"  # the grammar completed and only EOS was left
    jsonschema.validate(json.loads(text), PERSON)
    plain = SamplingParams(max_tokens=40, **sampling)
    free = engine.generate([engine.tokenizer.encode("A person, as JSON: ")], plain)[0]
    with pytest.raises(ValueError):  # unconstrained, the same model writes no JSON
        json.loads(engine.tokenizer.decode(free.output_ids))


def test_json_object_admits_any_object_and_only_an_object(engine):
    """json_object (no schema): the first token must open an object; once one is closed, only
    EOS is left; in between, any member (a random model's strings can run on, so the masks are
    checked rather than an answer)."""
    grammars = engine.grammars
    g = json_schema_grammar(None)
    tok = engine.tokenizer

    def allowed(text: str) -> set[int]:
        state = grammars.state(g)
        return set(grammars.mask(state, tok.encode(text)[1:]).nonzero()[0].tolist())

    assert allowed("") == {ord("{")}
    assert {ord("}"), ord(",")} <= allowed('{"any":[1,"x"]')
    assert ord("}") not in allowed('{"any":')
    assert allowed('{"a":{"b":null}}') == set(tok.eos_token_ids)


def test_the_state_rebuilt_from_the_output_gives_the_same_masks(engine):
    """Main rebuilds the grammar state from the token IDs the relay handed it: at every position
    a fresh state fed the output so far masks like the state that followed each draw."""

    grammars = engine.grammars
    grammar = json_schema_grammar(PERSON)
    eos = tuple(engine.tokenizer.eos_token_ids)
    params = SamplingParams(max_tokens=60, stop_token_ids=eos, grammar=grammar, seed=9)
    out = engine.generate([engine.tokenizer.encode("x")], params)[0].output_ids
    followed = grammars.state(grammar)
    for k in range(0, len(out), 7):
        fresh = grammars.state(grammar)
        assert (grammars.mask(fresh, out[:k]) == grammars.mask(followed, out[:k])).all()


def test_a_byte_level_bpe_tokenizer(tmp_path):
    pytest.importorskip("transformers")
    from pddflow.testing.tiny_checkpoints import tiny_qwen3

    eng = Engine.from_spec(str(tiny_qwen3(tmp_path / "qwen3", seed=2)))
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "maximum": 999}, "b": {"type": "boolean"}},
        "required": ["n", "b"],
        "additionalProperties": False,
    }
    text, finish = _answer(eng, "Give n: ", schema, temperature=0.8, seed=3)
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), schema)


class _NoClosingBrace:
    """The built-in byte tokenizer with `}` missing from its vocabulary (its ID names no bytes,
    and text is encoded without it): no token can close a JSON object."""

    def __init__(self, inner):
        self._inner = inner
        self.eos_token_ids = inner.eos_token_ids
        self.BOS = inner.BOS

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._inner.encode(text.replace("}", ""), add_special_tokens)

    def decode(self, ids: list[int]) -> str:
        return self._inner.decode(ids)

    def token_bytes(self, token_id: int) -> bytes:
        return b"" if token_id == ord("}") else self._inner.token_bytes(token_id)


def test_a_grammar_dead_end_ends_the_answer_with_its_own_finish_reason():
    """A grammar the vocabulary cannot finish: the answer ends where the grammar admits no token,
    and says so (`grammar_dead_end`, never `stop`, which promises a complete answer)."""
    from pddflow.operators.grammar import GRAMMAR_DEAD_END

    eng = Engine.from_spec("builtin:tiny-llama")
    eng.tokenizer = _NoClosingBrace(eng.tokenizer)
    schema = {
        "type": "object",
        "properties": {"a": {"type": "boolean"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    text, finish = _answer(eng, "x", schema)
    assert finish == GRAMMAR_DEAD_END
    assert text.startswith('{"a":') and "}" not in text
    # a grammar this vocabulary can finish still ends with stop
    text, finish = _answer(eng, "x", {"enum": ["yes", "no"]})
    assert finish == "stop" and json.loads(text) in ("yes", "no")
