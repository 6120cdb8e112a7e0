"""Tool calling (docs/openai-api.md, Tool calling): the model family's tool-call format, read from
its chat template; the grammar that makes `tool_choice: required` or a named function produce a
call whose arguments fit the function's schema; and the parse of the model's text into OpenAI's
`tool_calls`.

Formats: `hermes` (Qwen, Hermes and the built-in model: `<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>`, one block per call), `mistral` (`[TOOL_CALLS][{"name": ..., "arguments":
{...}}, ...]`) and `llama3` (a JSON object `{"name": ..., "parameters": {...}}`, after
`<|python_tag|>` or alone).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pddflow.operators.grammar import grammar_engine
from pddflow.runtime.frontend.chat_template import HERMES, LLAMA3, MISTRAL

_HERMES_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return out if index is None else {"index": index, **out}


def _call_schema(tool: dict[str, Any], args_key: str) -> dict[str, Any]:
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, args_key: params},
        "required": ["name", args_key],
        "additionalProperties": False,
    }


def tool_grammar(tools: list[dict[str, Any]], fmt: str, parallel: bool) -> str:
    """A grammar whose every sentence is one call (or, parallel, one or more) of these tools in
    the format, arguments valid against each function's `parameters` (compact JSON)."""
    args_key = "parameters" if fmt == LLAMA3 else "arguments"
    calls = [_call_schema(t, args_key) for t in tools]
    schema: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = {**schema, "x-guidance": {"whitespace_flexible": False}}
    call = f"call: %json {json.dumps(schema)}"
    if fmt == MISTRAL:
        many = ' ("," call)*' if parallel else ""
        lark = f'start: "[TOOL_CALLS][" call{many} "]"\n{call}\n'
    elif fmt == LLAMA3:  # one call: the format has no list
        lark = f"start: call\n{call}\n"
    else:
        many = ' ("\\n" block)*' if parallel else ""
        lark = f'start: block{many}\nblock: "<tool_call>\\n" call "\\n</tool_call>"\n{call}\n'
    return grammar_engine().grammar_from("lark", lark)


def _call_of(obj: Any, args_key: str, names: set[str]) -> ToolCall | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get(args_key, obj.get("arguments", {}))
    return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args))


def parse_tool_calls(
    text: str, fmt: str, tools: list[dict[str, Any]]
) -> tuple[str | None, list[ToolCall]]:
    """(the content left, the calls) of a model's answer: calls of declared tools whose JSON
    parses; anything else stays content."""
    names = {t["function"]["name"] for t in tools}
    calls: list[ToolCall] = []
    if fmt == HERMES:
        for m in _HERMES_CALL.finditer(text):
            try:
                call = _call_of(json.loads(m.group(1)), "arguments", names)
            except json.JSONDecodeError:
                call = None
            if call is not None:
                calls.append(call)
        content = _HERMES_CALL.sub("", text).strip() if calls else text
        return content or None, calls
    if fmt == MISTRAL:
        head, sep, tail = text.partition("[TOOL_CALLS]")
        try:
            found = json.loads(tail) if sep else None
        except json.JSONDecodeError:
            found = None
        for obj in found if isinstance(found, list) else []:
            if (call := _call_of(obj, "arguments", names)) is not None:
                calls.append(call)
        return (head.strip() or None) if calls else text, calls
    body = text.split("<|python_tag|>", 1)[-1].strip()
    try:
        call = _call_of(json.loads(body), "parameters", names)
    except json.JSONDecodeError:
        call = None
    return (None, [call]) if call is not None else (text, [])


@dataclass
class ToolUse:
    """A chat request's tools as they shape its answer: `mode` auto, required, or the one
    function's name (tool_choice none: no ToolUse)."""

    tools: list[dict[str, Any]]
    fmt: str
    mode: str
    parallel: bool = True
    answered: Callable[[], None] | None = None  # told of each answer that called tools

    def grammar(self) -> str | None:
        """The grammar that forces a call (required, a named function); None for auto."""
        if self.mode == "auto":
            return None
        chosen = [t for t in self.tools if self.mode in ("required", t["function"]["name"])]
        return tool_grammar(chosen, self.fmt, self.parallel and self.mode == "required")

    def answer(self, text: str) -> tuple[str | None, list[ToolCall]]:
        content, calls = parse_tool_calls(text, self.fmt, self.tools)
        if calls and self.answered is not None:
            self.answered()
        return content, calls
