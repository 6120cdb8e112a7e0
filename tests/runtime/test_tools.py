"""Tool calling's parts: the format read from a chat template, the parse of each family's call
text into OpenAI's tool_calls, and the grammar that makes a random model's forced call parse and
fit the function's schema in every format. The API and the deployed path: test_openai_api_fast.py,
test_deploy_pdd.py."""

from __future__ import annotations

import json

import pytest

from pddflow.core.payloads import SamplingParams
from pddflow.operators.engine import Engine
from pddflow.runtime.api.tool_stream import ToolCallStream
from pddflow.runtime.api.tools import ToolUse, parse_tool_calls
from pddflow.runtime.frontend.chat_template import HERMES, LLAMA3, MISTRAL, tool_format
from pddflow.testing.chaos import greedy_reference
from pddflow.testing.tiny_checkpoints import (
    CHATML_TEMPLATE,
    MISTRAL_TEMPLATE,
    QWEN_TOOLS_TEMPLATE,
)

jsonschema = pytest.importorskip("jsonschema")

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]


def test_the_format_is_read_from_the_template():
    assert tool_format(None) == HERMES  # the built-in model's plain rendering
    assert tool_format(QWEN_TOOLS_TEMPLATE) == HERMES
    assert tool_format("{{ '[TOOL_CALLS]' }}") == MISTRAL
    assert tool_format("<|python_tag|>{{ x }}") == LLAMA3
    assert tool_format(CHATML_TEMPLATE) == HERMES and tool_format(MISTRAL_TEMPLATE) == HERMES


ANSWERS = [
    (
        HERMES,
        'Let me see.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
        '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}'
        "\n</tool_call>",
        "Let me see.",
        [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo", "days": 2})],
    ),
    (HERMES, "No call here.", "No call here.", []),
    (  # an undeclared function and broken JSON stay text
        HERMES,
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call><tool_call>{oops</tool_call>',
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call><tool_call>{oops</tool_call>',
        [],
    ),
    (
        MISTRAL,
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 3, "b": 4}}]',
        None,
        [("add", {"a": 3, "b": 4})],
    ),
    (
        LLAMA3,
        '<|python_tag|>{"name": "add", "parameters": {"a": 5, "b": 6}}',
        None,
        [("add", {"a": 5, "b": 6})],
    ),
    (LLAMA3, '{"name": "nope", "parameters": {}}', '{"name": "nope", "parameters": {}}', []),
    (LLAMA3, "Plain {text}.", "Plain {text}.", []),
]


@pytest.mark.parametrize("fmt, text, content, calls", ANSWERS)
def test_each_familys_calls_parse_into_openai_tool_calls(fmt, text, content, calls):
    left, got = parse_tool_calls(text, fmt, TOOLS)
    assert left == content
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert all(c.openai()["id"].startswith("call_") for c in got)
    assert len({c.id for c in got}) == len(got)


@pytest.mark.parametrize("piece", [1, 3, 7, 1000])
@pytest.mark.parametrize("fmt, text, content, calls", ANSWERS)
def test_calls_stream_as_written_and_add_up_to_the_parse(fmt, text, content, calls, piece):
    """Fed in pieces of any size, the streamed deltas are OpenAI's: each call's first delta has
    its id, type and name and empty arguments, the rest only argument text, which adds up to
    the parsed call's arguments; the content is the parse's."""
    stream = ToolCallStream(ToolUse(TOOLS, fmt, "auto"))
    said, deltas = "", []
    for i in range(0, len(text), piece):
        more, d = stream.feed(text[i : i + piece])
        said, deltas = said + more, deltas + d
    more, d = stream.finish()
    said, deltas = said + more, deltas + d
    assert (said or None) == content and not stream.cut_short
    heads = [d for d in deltas if "id" in d]
    assert [(h["index"], h["type"], h["function"]) for h in heads] == [
        (i, "function", {"name": name, "arguments": ""}) for i, (name, _) in enumerate(calls)
    ]
    assert all(set(d) == {"index", "function"} for d in deltas if "id" not in d)
    args = [
        "".join(d["function"]["arguments"] for d in deltas if d["index"] == i)
        for i in range(len(calls))
    ]
    assert [json.loads(a) for a in args] == [a for _, a in calls]


def test_a_call_cut_short_is_said_to_be():
    stream = ToolCallStream(ToolUse(TOOLS, HERMES, "add"))
    _, deltas = stream.feed('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b"')
    assert deltas[0]["function"]["name"] == "add"
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"a": 1, "b"'
    assert stream.finish() == ("", []) and stream.cut_short


@pytest.fixture(scope="module")
def engine() -> Engine:
    return greedy_reference().engine


@pytest.mark.slow  # six constrained generations on the built-in model
@pytest.mark.parametrize("fmt", [HERMES, MISTRAL, LLAMA3])
@pytest.mark.parametrize("mode", ["get_weather", "required"])
def test_a_forced_call_parses_and_fits_its_schema_in_every_format(engine, fmt, mode):
    """The random built-in model, forced by the grammar: named, that function; required (one
    call), one of the tools; arguments valid against the function's parameters."""
    use = ToolUse(TOOLS, fmt, mode, parallel=False)
    eos = tuple(engine.tokenizer.eos_token_ids)
    params = SamplingParams(
        max_tokens=200, temperature=0.9, seed=7, stop_token_ids=eos, grammar=use.grammar()
    )
    seq = engine.generate([engine.tokenizer.encode("Call a tool: ")], params)[0]
    text = engine.tokenizer.decode(seq.output_ids)
    assert seq.finish_reason == "stop", text
    content, calls = use.answer(text)
    assert len(calls) == 1 and content is None, text
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[calls[0].name]
    if mode != "required":
        assert calls[0].name == mode
    jsonschema.validate(json.loads(calls[0].arguments), schema)


def test_auto_adds_no_grammar():
    assert ToolUse(TOOLS, HERMES, "auto").grammar() is None


@pytest.mark.parametrize(
    "fmt, text", [(HERMES, '<tool_call>\n{"na'), (LLAMA3, '{"name": "ad'), (HERMES, "<tool_")]
)
def test_a_call_that_never_named_its_tool_is_content(fmt, text):
    stream = ToolCallStream(ToolUse(TOOLS, fmt, "auto"))
    said, deltas = stream.feed(text)
    assert deltas == [] and said == ""  # it may still become a call
    assert stream.finish() == (text, []) and not stream.calls
