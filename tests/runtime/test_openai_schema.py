"""Request bodies: a seed is an integer in [0, 2^63), and text with an unpaired surrogate is refused
naming its field (both were 500s: a protobuf uint64 overflow, a tokenizer UnicodeEncodeError).
The HTTP side (400 in the OpenAI shape) is checked on a live deployment in test_deploy_pdd.py."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from pddflow.runtime.api.schema import (
    SEED_LIMIT,
    ChatBody,
    CompletionBody,
    FieldError,
    unpaired_surrogate,
)


def _completion(**kw):
    return CompletionBody.model_validate({"model": "m", "prompt": "hi", **kw})


@pytest.mark.parametrize("seed", [0, 1, SEED_LIMIT - 1, None])
def test_seeds_in_range(seed):
    assert _completion(seed=seed).seed == seed


@pytest.mark.parametrize(
    "seed, words",
    [
        (-1, "greater than or equal to 0"),
        (SEED_LIMIT, "less than 9223372036854775808"),
        (1 << 64, "less than"),  # was a protobuf uint64 overflow: 500
        (True, "valid integer"),  # a bool is not an int
        (1.0, "valid integer"),
        ("7", "valid integer"),
    ],
)
def test_bad_seeds_name_the_field(seed, words):
    with pytest.raises(ValidationError) as err:
        _completion(seed=seed)
    (e,) = err.value.errors()
    assert e["loc"] == ("seed",) and words in e["msg"]


def _refused_field(model, body: dict) -> str:
    with pytest.raises(ValidationError) as err:
        model.model_validate(body)
    named = err.value.errors()[0]["ctx"]["error"]
    assert isinstance(named, FieldError) and "unpaired surrogate" in str(named)
    return named.field


def test_unpaired_surrogates_are_refused_naming_the_field():
    # what json.loads makes of "\ud800": a lone high surrogate, valid JSON but no character
    lone = json.loads('"a\\ud800b"')
    assert _refused_field(CompletionBody, {"model": "m", "prompt": lone}) == "prompt"
    assert _refused_field(CompletionBody, {"model": "m", "prompt": [lone]}) == "prompt.0"
    assert (
        _refused_field(ChatBody, {"model": "m", "messages": [{"role": "user", "content": lone}]})
        == "messages.0.content"
    )
    parts = [{"type": "text", "text": "fine"}, {"type": "text", "text": "\udfff"}]
    turns = [{"role": "system", "content": "x"}, {"role": "user", "content": parts}]
    assert (
        _refused_field(ChatBody, {"model": "m", "messages": turns}) == "messages.1.content.1.text"
    )
    assert _refused_field(CompletionBody, {"model": "m", "prompt": "x", "stop": [lone]}) == "stop.0"


def test_surrogate_pairs_and_other_text_pass():
    pair = json.loads('"\\ud83d\\ude00"')  # one character, U+1F600, written as a pair
    assert _completion(prompt=f"smile {pair} é").prompt == "smile \U0001f600 é"
    assert unpaired_surrogate({"a": ["ok", {"b": "ü"}], "n": 3}) is None
    bad = unpaired_surrogate({"a": ["ok", {"b": "\ud800"}]})
    assert bad is not None and bad.field == "a.1.b" and "U+D800 at character 0" in str(bad)
