"""One completion as the API serves it: admission to end, the router's token stream
read so that a disconnect or a shutdown can abort it at any await, text pieces held back for stop
strings; the n of one request (`Choices`), and the SSE framing of a streamed answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from pddflow.core.payloads import TokenLogprob
from pddflow.operators.detokenize import detokenizer
from pddflow.operators.grammar import GRAMMAR_DEAD_END
from pddflow.runtime.api.admission import Admission
from pddflow.runtime.api.logprobs import chat_logprobs, completion_logprobs
from pddflow.runtime.api.router import Router
from pddflow.runtime.api.schema import _Body
from pddflow.runtime.api.stop_strings import StopStrings
from pddflow.runtime.api.tool_stream import ToolCallStream
from pddflow.runtime.api.tools import ToolCall, ToolUse
from pddflow.runtime.frontend.rejection import RequestRejected


class ClientGone(Exception):
    """The client of a request hung up."""


async def on_disconnect(request: Request, completion: Completion) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    completion.abort(ClientGone())


class CompletionResponse(StreamingResponse):
    """An SSE answer that ends its completions however the stream ends (finished, failed,
    cancelled by a disconnect, or never started)."""

    def __init__(self, completion: Choices, content: AsyncIterator[bytes], **kw: Any):
        super().__init__(content, **kw)
        self.completion = completion

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.completion.close()


@dataclass(frozen=True)
class OutputOptions:
    """How a completion's tokens become its text, as the request asked (vLLM's fields)."""

    stop_ids: frozenset[int]  # a token that ends the output with finish_reason stop
    min_tokens: int = 0  # stop strings count only past this many tokens
    skip_special_tokens: bool = True
    include_stop_str: bool = False  # a stop string that ends the output is part of its text


class Completion:
    """One completion as the API produces it, from admission to its end: reads the router's token
    stream so that a disconnect or a shutdown can abort it at any await (`abort`)."""

    def __init__(
        self,
        router: Router,
        rid: str,
        stops: list[str],
        max_tokens: int,
        admission: Admission,
        output: OutputOptions,
    ):
        self.router, self.rid = router, rid
        self.max_tokens, self.admission = max_tokens, admission
        self.stream: AsyncIterator[list[int]] | None = None
        self.first: list[int] | None = None
        self.decoder = detokenizer(router.tokenizer, output.skip_special_tokens)
        self.stops = StopStrings(stops, output.include_stop_str)
        self.stop_ids, self.min_tokens = output.stop_ids, output.min_tokens
        self.ids: list[int] = []
        self.lps: list[TokenLogprob | None] = []  # parallel to ids (None: not reported)
        self._text: list[str] = []
        self.finish_reason = "length"
        self._stop: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()
        self._step: asyncio.Task | None = None
        self._closing: asyncio.Task | None = None  # held: the loop keeps only weak references
        self._closed = False

    def abort(self, exc: Exception) -> None:
        """End the request with exc: the router's stream is cancelled (every leg aborted) and the
        reader gets exc."""
        if self._stop.done() or self._closed:
            return
        self._stop.set_result(exc)
        if self._step is None:  # nothing reads the stream now (between two pieces): end it here
            self._closing = asyncio.get_running_loop().create_task(self.close())

    async def next_chunk(self) -> list[int] | None:
        if self._stop.done():
            raise self._stop.result()
        assert self.stream is not None
        step = self._step = asyncio.ensure_future(_anext(self.stream))
        step.add_done_callback(_retrieved)
        interrupted = False
        try:
            await asyncio.wait((step, self._stop), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not step.done():  # aborted, or this task was cancelled: cancel the request
                interrupted = True
                step.cancel()  # the router's generator ends: it aborts every leg
                await asyncio.wait((step,))
            self._step = None
        if interrupted:
            raise self._stop.result()
        return step.result()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.admission.leave(self)
        if self.stream is not None and (self._step is None or self._step.done()):
            # a step still running was cancelled (next_chunk): it ends the generator itself
            await self.stream.aclose()  # a stop string, or never finished: cancel everywhere

    @property
    def text(self) -> str:
        return "".join(self._text)

    def answer(self, tool_use: ToolUse | None) -> tuple[str, list[ToolCall]]:
        """The output as content, or as the tool calls it makes (none from an output its
        grammar cut short: a call must parse whole)."""
        if tool_use is None or self.finish_reason == GRAMMAR_DEAD_END:
            return self.text, []
        return tool_use.answer(self.text)

    def _text_of(self, chunk: list[int], before: int) -> tuple[str, bool]:
        """The chunk's text past the stop strings, and whether one ended the output. vLLM's
        min_tokens: stop strings are looked for only in the text of the tokens after the first
        min_tokens (a chunk that straddles that count is split there)."""
        free = max(0, min(len(chunk), self.min_tokens - before))
        head = self.decoder.push(chunk[:free]) if free else ""
        if free == len(chunk):
            return head, False
        piece, hit = self.stops.feed(self.decoder.push(chunk[free:]))
        return head + piece, hit

    async def text_pieces(
        self,
    ) -> AsyncIterator[tuple[str, list[int], list[TokenLogprob | None]]]:
        """(text, ids, their logprobs) per chunk of ids; text held back while it may begin a stop
        string, and nothing past a stop string."""
        try:
            chunk = self.first
            while chunk is not None:
                lps = getattr(chunk, "logprobs", None) or [None] * len(chunk)
                self.ids.extend(chunk)
                self.lps.extend(lps)
                if self.stop_ids.intersection(chunk):
                    self.finish_reason = "stop"
                if getattr(chunk, "finish_reason", None) == GRAMMAR_DEAD_END:
                    self.finish_reason = GRAMMAR_DEAD_END  # incomplete: never call it a stop
                piece, hit = self._text_of(chunk, len(self.ids) - len(chunk))
                self._text.append(piece)
                if hit:
                    self.finish_reason = "stop"
                    self.router.stopped(self.rid)
                    yield piece, chunk, lps
                    return
                yield piece, chunk, lps
                chunk = await self.next_chunk()
            rest = self.decoder.flush()
            if len(self.ids) > self.min_tokens:
                tail, hit = self.stops.feed(rest, final=True)
            else:
                tail, hit = rest, False
            if hit:
                self.finish_reason = "stop"
                self.router.stopped(self.rid)
            if tail:
                self._text.append(tail)
                yield tail, [], []
        finally:
            await self.close()


class Choices:
    """The n completions of one request (OpenAI's `n`): each its own flight through the
    pipeline with its own seed; aborted and closed together."""

    def __init__(self, completions: list[Completion]):
        self.items = completions

    def abort(self, exc: Exception) -> None:
        for c in self.items:
            c.abort(exc)

    async def close(self) -> None:
        for c in self.items:
            await c.close()

    def best(self, n: int) -> list[Completion]:
        """The n with the highest mean log probability per token (OpenAI's best_of), best
        first; all of them, in order, when there are n."""
        if len(self.items) <= n:
            return self.items

        def per_token(c: Completion) -> float:
            lps = [lp.logprob for lp in c.lps if lp is not None]
            return sum(lps) / len(lps) if lps else float("-inf")

        return sorted(self.items, key=per_token, reverse=True)[:n]

    async def read_all(self) -> None:
        """A whole answer of every choice, read side by side."""

        async def read(c: Completion) -> None:
            async for _ in c.text_pieces():
                pass

        await asyncio.gather(*(read(c) for c in self.items))


async def sse(
    choices: Choices,
    rid: str,
    created: int,
    body: _Body,
    chat: bool,
    usage: Callable[[], dict[str, Any]],
    tool_use: ToolUse | None = None,
) -> AsyncIterator[bytes]:
    """The answer as server-sent events. With tools in play, a choice's calls stream as OpenAI's
    `delta.tool_calls` as the model writes them (api/tool_stream.py), its other text as
    content."""
    tokenizer = choices.items[0].router.tokenizer
    # completions' text_offset per choice: where the next token's text starts in its output
    offsets = [0] * len(choices.items)

    def frame(
        index: int,
        delta_text: str | None,
        ids: list[int],
        finish: str | None,
        role: bool = False,
        lps: list[TokenLogprob | None] | None = None,
        tool_deltas: list[dict[str, Any]] | None = None,
    ) -> bytes:
        # each chunk carries the logprobs of the tokens it carries (none: null)
        logprobs = None
        if lps is not None and body.logprob_count is not None:
            if chat:
                logprobs = chat_logprobs(tokenizer, ids, lps)
            else:
                logprobs, offsets[index] = completion_logprobs(tokenizer, ids, lps, offsets[index])
        if chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if delta_text is not None:
                delta["content"] = delta_text
            if tool_deltas:
                delta["tool_calls"] = tool_deltas
            choice: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "finish_reason": finish,
                "logprobs": logprobs,
            }
        else:
            choice = {
                "index": index,
                "text": delta_text or "",
                "finish_reason": finish,
                "logprobs": logprobs,
            }
        if body.return_token_ids:
            choice["token_ids"] = ids
        obj = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": body.model,
            "choices": [choice],
        }
        if body.include_usage:  # null but in vLLM's continuous mode: the usage so far
            obj["usage"] = usage() if body.continuous_usage else None
        return f"data: {json.dumps(obj)}\n\n".encode()

    async def frames(index: int, completion: Completion) -> AsyncIterator[bytes]:
        if tool_use is not None:  # calls streamed as they are written, the rest as content
            calls = ToolCallStream(tool_use)
            async for piece, ids, lps in completion.text_pieces():
                text, deltas = calls.feed(piece)
                content = text if text or not deltas else None
                yield frame(index, content, ids, None, lps=lps if ids else None, tool_deltas=deltas)
            text, deltas = calls.finish()
            if text or deltas:
                yield frame(index, text or None, [], None, tool_deltas=deltas)
            called = calls.calls and not calls.cut_short
            if called and completion.finish_reason != GRAMMAR_DEAD_END:
                if tool_use.answered is not None:
                    tool_use.answered()
                yield frame(index, None, [], "tool_calls")
            else:
                yield frame(index, None, [], completion.finish_reason)
            return
        async for piece, ids, lps in completion.text_pieces():
            yield frame(index, piece, ids, None, lps=lps if ids else None)
        yield frame(index, None if chat else "", [], completion.finish_reason)

    if chat:
        for i in range(len(choices.items)):
            yield frame(i, "", [], None, role=True)
    try:
        async for data in _merged([frames(i, c) for i, c in enumerate(choices.items)]):
            yield data
    except RequestRejected as exc:
        err = {
            "error": {
                "message": str(exc),
                "type": "server_error",
                "param": None,
                "code": exc.status,
            }
        }
        yield f"data: {json.dumps(err)}\n\n".encode()
        return
    if body.include_usage:  # OpenAI's last chunk: no choices, the whole request's usage
        last = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": body.model,
            "choices": [],
            "usage": usage(),
        }
        yield f"data: {json.dumps(last)}\n\n".encode()
    yield b"data: [DONE]\n\n"


async def _merged(streams: list[AsyncIterator[bytes]]) -> AsyncIterator[bytes]:
    """The items of every stream as they come; the first error ends them all. One stream is
    read directly (no task between the client and its request)."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield item
        return
    queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[bytes]) -> None:
        try:
            async for item in stream:
                await queue.put(item)
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            await queue.put(exc)
        finally:
            await queue.put(None)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _anext(stream: AsyncIterator[list[int]]) -> list[int] | None:
    return await anext(stream, None)


def _retrieved(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()  # read by next_chunk, unless it was interrupted: never logged as lost
