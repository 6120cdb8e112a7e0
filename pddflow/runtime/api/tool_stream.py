"""Tool calls streamed as the model writes them (OpenAI's `delta.tool_calls`): a call's first
delta once its function's name is known (`id`, `type`, `function.name`, `arguments: ""`), then its
arguments' JSON text piece by piece as it grows; text outside calls streams as content, held back
only while it may be the start of a call marker.

The text is scanned as far as it goes on every piece: a call's JSON object is read member by
member (`scan_object`), so a member's value is known to end where its brackets and strings
balance, without waiting for the whole answer. A `tool_choice: auto` block that turns out to be
no call of a declared tool (an unknown name, broken JSON) goes out as content once it is known not
to be one; what was already streamed of a call stays streamed (as vLLM's parsers do), and the
choice's finish reason says whether the answer completed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pddflow.runtime.api.tools import ToolCall, ToolUse
from pddflow.runtime.frontend.chat_template import HERMES, LLAMA3, MISTRAL

_WS = " \t\r\n"


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _string_end(text: str, i: int) -> int | None:
    """text[i] is a quote: the index after its closing quote (None: not closed yet)."""
    i += 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return None


def _value_end(text: str, i: int) -> int | None:
    """A JSON value starts at text[i]: the index after it (None: it may go on)."""
    if text[i] == '"':
        return _string_end(text, i)
    if text[i] in "{[":
        depth = 0
        while i < len(text):
            c = text[i]
            if c == '"':
                end = _string_end(text, i)
                if end is None:
                    return None
                i = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None
    j = i  # a number, true, false, null: ends at a delimiter
    while j < len(text) and text[j] not in _WS + ",}]":
        j += 1
    return j if j < len(text) else None


@dataclass
class ObjectScan:
    """A JSON object's top-level members as far as its text goes."""

    members: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # key: value span
    end: int | None = None  # index after the closing brace, once there
    broken: bool = False  # not JSON: it can never become an object


def scan_object(text: str, start: int) -> ObjectScan:
    """text[start] is `{`: its members so far (a value's end None while it may go on)."""
    out = ObjectScan()
    i = start + 1
    while True:
        i = _skip_ws(text, i)
        if i >= len(text):
            return out
        if text[i] == "}":
            out.end = i + 1
            return out
        if text[i] == "," and out.members:
            i = _skip_ws(text, i + 1)
            if i >= len(text):
                return out
        if text[i] != '"':
            out.broken = True
            return out
        key_end = _string_end(text, i)
        if key_end is None:
            return out
        try:
            key = json.loads(text[i:key_end])
        except json.JSONDecodeError:
            out.broken = True
            return out
        i = _skip_ws(text, key_end)
        if i >= len(text):
            return out
        if text[i] != ":":
            out.broken = True
            return out
        i = _skip_ws(text, i + 1)
        if i >= len(text):
            return out
        end = _value_end(text, i)
        out.members[key] = (i, end)
        if end is None:
            return out
        i = end


@dataclass
class _Call:
    start: int  # where its JSON object starts in the text
    call: ToolCall | None = None  # once its name is known (its first delta sent)
    index: int = 0  # its place in the choice's tool_calls
    sent: int = 0  # characters of its arguments' text sent


class ToolCallStream:
    """One choice's text, piece by piece, as OpenAI's streamed deltas: `feed` and `finish`
    return (content, tool-call deltas) to send now."""

    def __init__(self, use: ToolUse):
        self.fmt = use.fmt
        self.names = {t["function"]["name"] for t in use.tools}
        self.args_key = "parameters" if use.fmt == LLAMA3 else "arguments"
        self.text = ""
        self.shown = 0  # text up to here is sent (as content, or as calls)
        self.calls: list[ToolCall] = []  # every call streamed
        self._open: _Call | None = None  # the call being written
        self._in_list = False  # inside mistral's [TOOL_CALLS][...]
        self._skipping = False  # hermes: inside a block that is no call, up to its closing tag
        self._closing = False  # hermes: after a call, before its block's closing tag
        self._plain = False  # the rest of the answer is content
        self._held = ""  # whitespace not sent yet
        self.cut_short = False  # the answer ended inside a call

    def feed(self, piece: str) -> tuple[str, list[dict[str, Any]]]:
        self.text += piece
        return self._advance(final=False)

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        return self._advance(final=True)

    # ---- the scan ------------------------------------------------------------------------------
    def _advance(self, final: bool) -> tuple[str, list[dict[str, Any]]]:
        content: list[str] = []
        deltas: list[dict[str, Any]] = []
        while not self._plain:
            if self._skipping:
                stop = self.text.find("</tool_call>", self.shown)
                if stop < 0:
                    break
                self._show(content, stop + len("</tool_call>"))
                self._skipping = False
            elif self._closing:
                if not self._close_block(final):
                    break
            elif self._open is not None:
                if not self._follow(deltas, final):
                    break
            else:
                start = self._next_call(content, final)
                if start is None:
                    if self._skipping:
                        continue
                    break
                self._open = _Call(start, index=len(self.calls))
        if self._plain or final:  # what is left never became a call
            self._show(content, len(self.text))
        if final:
            if not self.calls:  # whitespace around calls is dropped, an answer's is its own
                content.append(self._held)
            self._held = ""
        return "".join(content), deltas

    def _show(self, content: list[str], upto: int) -> None:
        """Send the text up to `upto` as content; trailing whitespace is held until more text
        follows (the whitespace around calls is no content)."""
        if upto <= self.shown:
            return
        piece = self._held + self.text[self.shown : upto]
        self.shown = upto
        body = piece.rstrip(_WS)
        self._held = piece[len(body) :]
        if body:
            content.append(body)

    def _next_call(self, content: list[str], final: bool) -> int | None:
        """Send the content before the next call's object; its start (None: none yet)."""
        text = self.text
        if self.fmt == HERMES:
            marker = text.find("<tool_call>", self.shown)
            if marker < 0:
                self._show(content, _safe_end(text, self.shown, "<tool_call>", final))
                return None
            self._show(content, marker)
            j = _skip_ws(text, marker + len("<tool_call>"))
            if j < len(text) and text[j] != "{":
                self._skipping = True  # no JSON object: content up to the closing tag
                return None
            return j if j < len(text) else None
        if self.fmt == MISTRAL:
            if not self._in_list:
                marker = text.find("[TOOL_CALLS]", self.shown)
                if marker < 0:
                    self._show(content, _safe_end(text, self.shown, "[TOOL_CALLS]", final))
                    return None
                self._show(content, marker)
                j = _skip_ws(text, marker + len("[TOOL_CALLS]"))
                if j >= len(text):
                    return None
                if text[j] != "[":
                    self._plain = True
                    return None
                self._in_list, self.shown = True, j + 1
            j = _skip_ws(text, self.shown)
            if j < len(text) and text[j] == "," and self.calls:
                j = _skip_ws(text, j + 1)
            if j >= len(text):
                return None
            if text[j] == "]":  # the list ends: content may follow
                self._in_list, self.shown = False, j + 1
                return self._next_call(content, final)
            if text[j] != "{":
                self._plain = True
                return None
            return j
        # llama3: the whole answer is one call, after <|python_tag|> or alone
        j = _skip_ws(text, self.shown)
        if text.startswith("<|python_tag|>", j):
            j = _skip_ws(text, j + len("<|python_tag|>"))
        elif "<|python_tag|>".startswith(text[j:]) and not final:
            return None  # may be the tag
        if j < len(text) and text[j] == "{":
            return j
        self._plain = j < len(text) or final  # no call: the answer is content
        return None

    def _follow(self, deltas: list[dict[str, Any]], final: bool) -> bool:
        """Stream the open call; True once it is over (the scan goes on after it)."""
        call, text = self._open, self.text
        assert call is not None
        scan = scan_object(text, call.start)
        name_span = scan.members.get("name")
        if call.call is None and name_span is not None and name_span[1] is not None:
            name = _json(text[name_span[0] : name_span[1]])
            if isinstance(name, str) and name in self.names:
                call.call = ToolCall(name, "")
                self.calls.append(call.call)
                deltas.append(call.call.openai(index=call.index))
            else:
                scan.broken = True  # no declared tool's call
        if call.call is not None:
            span = scan.members.get(self.args_key) or scan.members.get("arguments")
            if span is not None:
                upto = span[1] if span[1] is not None else len(text)
                self._send_arguments(call, text[span[0] + call.sent : upto], deltas)
        if call.call is None and (scan.broken or scan.end is not None or final):
            return self._not_a_call()
        if scan.end is None:
            if final:  # a call cut short: what it had is streamed
                self._open, self.shown, self.cut_short = None, len(text), True
            return False
        if not call.call.arguments:  # no arguments member: none
            self._send_arguments(call, "{}", deltas)
        self._open, self.shown = None, scan.end
        self._closing = self.fmt == HERMES
        self._plain = self.fmt == LLAMA3
        return True

    @staticmethod
    def _send_arguments(call: _Call, piece: str, deltas: list[dict[str, Any]]) -> None:
        if piece and call.call is not None:
            call.sent += len(piece)
            call.call.arguments += piece
            deltas.append({"index": call.index, "function": {"arguments": piece}})

    def _close_block(self, final: bool) -> bool:
        """Past hermes' closing tag after a call; False while the text may still be it."""
        tag = "</tool_call>"
        j = _skip_ws(self.text, self.shown)
        if self.text.startswith(tag, j):
            self.shown = j + len(tag)
        elif tag.startswith(self.text[j:]) and not final:
            return False  # whitespace, or the tag's start, so far
        self._closing = False  # anything else: content again
        return True

    def _not_a_call(self) -> bool:
        """The open object is no call of a declared tool: content (hermes: up to its block's
        closing tag; the other formats: the rest of the answer)."""
        self._open = None
        if self.fmt == HERMES:
            self._skipping = True
        else:
            self._plain = True
        return True


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _safe_end(text: str, i: int, marker: str, final: bool) -> int:
    """Where content can be sent up to: before a tail that may begin the marker."""
    if final:
        return len(text)
    for k in range(min(len(marker) - 1, len(text) - i), 0, -1):
        if marker.startswith(text[len(text) - k :]):
            return len(text) - k
    return len(text)
