"""The OpenAI-compatible HTTP API (docs/runtime.md, API): it only translates HTTP to the `Frontend`
protocol below, so any backend can serve it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from pddflow.core.payloads import SamplingParams
from pddflow.runtime.openai_schema import ChatBody, CompletionBody, FieldError, _Body, render_chat

DEFAULT_TIMEOUT_S = 300.0


class RequestRejected(Exception):
    """A request the deployment will not run; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Tokenizer(Protocol):
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


class Frontend(Protocol):
    model_id: str
    tokenizer: Tokenizer
    vocab_size: int
    max_context: int

    def attach(self, loop: asyncio.AbstractEventLoop) -> None: ...
    def health(self) -> tuple[bool, dict[str, Any]]: ...
    def metrics_text(self) -> tuple[bytes, str]: ...
    def timeline(self, request_id: str) -> dict[str, Any] | None: ...
    def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        deadline: float,
        variant: str | None,
        handoff: str | None,
    ) -> AsyncIterator[list[int]]: ...


def _error(
    status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": None}},
        status_code=status,
    )


class _Utf8Stream:
    """Never splits a multi-byte character."""

    def __init__(self, tok: Tokenizer):
        self.tok, self.ids, self.sent = tok, [], ""

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete character: wait for its next bytes
            return ""
        new, self.sent = text[len(self.sent) :], text
        return new

    def flush(self) -> str:
        text = self.tok.decode(self.ids)
        new, self.sent = text[len(self.sent) :], text
        return new


class LinkCut(BaseModel):
    seconds: float = Field(gt=0, le=3600, description="how long the link stays down")
    after_bytes: int = Field(
        0, ge=0, description="cut once this many more bytes crossed it (mid-transfer)"
    )


def make_app(frontend: Frontend, backend: Any = None) -> FastAPI:
    """`backend`, when it can (the local backend), adds /admin/links/{name}/cut: failure drills on
    the emulated WAN."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # reports are handled on the server's loop from now on
        frontend.attach(asyncio.get_running_loop())
        yield

    app = FastAPI(
        title="pddflow",
        description="OpenAI-compatible API of a pddflow deployment",
        lifespan=lifespan,
    )

    @app.exception_handler(RequestValidationError)
    async def _bad_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        named = (first.get("ctx") or {}).get("error")
        if isinstance(named, FieldError):
            return _error(400, str(named), param=named.field)
        where = ".".join(str(p) for p in first["loc"] if p != "body")
        return _error(
            400, f"{where}: {first['msg']}" if where else first["msg"], param=where or None
        )

    @app.get("/health")
    async def health() -> JSONResponse:
        ready, detail = frontend.health()
        return JSONResponse(
            {"status": "ready" if ready else "starting", **detail},
            status_code=200 if ready else 503,
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        body, ctype = frontend.metrics_text()
        return Response(body, media_type=ctype)

    if backend is not None and hasattr(backend, "cut_link"):

        @app.post("/admin/links/{name}/cut")
        async def cut_link(name: str, body: LinkCut) -> JSONResponse:
            try:
                backend.cut_link(name, body.seconds, body.after_bytes)
            except KeyError as exc:
                return _error(404, str(exc.args[0]), kind="not_found_error")
            return JSONResponse(
                {"link": name, "down_s": body.seconds, "after_bytes": body.after_bytes}
            )

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": frontend.model_id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "pddflow",
                    "max_model_len": frontend.max_context,
                }
            ],
        }

    @app.get("/v1/requests/{request_id}/timeline")
    async def timeline(request_id: str) -> JSONResponse:
        t = frontend.timeline(request_id)
        if t is None:
            return _error(
                404,
                f"no request {request_id!r} (timelines of the most recent requests are kept)",
                kind="not_found_error",
            )
        return JSONResponse(t)

    @app.post("/v1/completions")
    async def completions(body: CompletionBody) -> Response:
        try:
            prompt_ids = _prompt_ids(frontend, body.prompt)
        except RequestRejected as exc:
            return _error(exc.status, str(exc), param="prompt")
        return await _serve(frontend, body, prompt_ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody) -> Response:
        try:
            ids = frontend.tokenizer.encode(render_chat(body.messages))
        except ValueError as exc:
            return _error(400, str(exc), param="messages")
        except RequestRejected as exc:
            return _error(exc.status, str(exc), param="messages")
        return await _serve(frontend, body, ids, chat=True)

    return app


def _prompt_ids(frontend: Frontend, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        return frontend.tokenizer.encode(prompt)
    bad = [t for t in prompt if not 0 <= t < frontend.vocab_size]
    if bad:
        raise RequestRejected(
            400, f"token id {bad[0]} is outside the vocabulary [0, {frontend.vocab_size})"
        )
    return list(prompt)


async def _serve(frontend: Frontend, body: _Body, prompt_ids: list[int], chat: bool) -> Response:
    if body.model != frontend.model_id:
        return _error(
            404,
            f"model {body.model!r} is not served here; it serves {frontend.model_id!r}",
            kind="not_found_error",
            param="model",
        )
    max_tokens = body.token_budget()
    if len(prompt_ids) + max_tokens > frontend.max_context:
        return _error(
            400,
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
            f"context of {frontend.max_context} tokens",
            param="max_tokens",
        )
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop_token_ids=tuple(frontend.tokenizer.eos_token_ids),
    )
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    deadline = time.monotonic() + (body.timeout_s or DEFAULT_TIMEOUT_S)
    try:
        stream = frontend.generate(rid, prompt_ids, sampling, deadline, body.variant, body.handoff)
        # rejections (bad variant, overload) surface before any byte is sent
        first = await anext(stream, None)
    except RequestRejected as exc:
        return _error(
            exc.status,
            str(exc),
            kind="invalid_request_error" if exc.status < 500 else "server_error",
        )
    created = int(time.time())
    run = _Run(frontend, stream, first, stops, max_tokens)
    if body.stream:
        return StreamingResponse(
            _sse(run, rid, created, body, chat),
            media_type="text/event-stream",
            headers={"X-Request-Id": rid},
        )
    try:
        async for _ in run.text_pieces():
            pass
    except RequestRejected as exc:
        return _error(exc.status, str(exc), kind="server_error")
    choice: dict[str, Any] = {"index": 0, "finish_reason": run.finish_reason, "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": run.text}
    else:
        choice["text"] = run.text
    if body.return_token_ids:
        choice["token_ids"] = run.ids
    return JSONResponse(
        {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": frontend.model_id,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(run.ids),
                "total_tokens": len(prompt_ids) + len(run.ids),
            },
        },
        headers={"X-Request-Id": rid},
    )


class _Run:
    def __init__(
        self,
        frontend: Frontend,
        stream: AsyncIterator[list[int]],
        first: list[int] | None,
        stops: list[str],
        max_tokens: int,
    ):
        self.stream, self.first, self.stops, self.max_tokens = stream, first, stops, max_tokens
        self.decoder = _Utf8Stream(frontend.tokenizer)
        self.eos = set(frontend.tokenizer.eos_token_ids)
        self.ids: list[int] = []
        self.text = ""
        self.finish_reason = "length"

    async def text_pieces(self) -> AsyncIterator[tuple[str, list[int]]]:
        try:
            chunk = self.first
            while chunk is not None:
                piece = self.decoder.push(chunk)
                self.ids.extend(chunk)
                if self.eos.intersection(chunk):
                    self.finish_reason = "stop"
                hit = self._stop_hit(piece)
                if hit is not None:
                    self.text += hit
                    self.finish_reason = "stop"
                    yield hit, chunk
                    return
                self.text += piece
                yield piece, chunk
                chunk = await anext(self.stream, None)
            tail = self.decoder.flush()
            if tail:
                self.text += tail
                yield tail, []
        finally:
            await self.stream.aclose()  # client gone or stop string: cancel the request everywhere

    def _stop_hit(self, piece: str) -> str | None:
        if not self.stops:
            return None
        text = self.text + piece
        cut = min((text.find(s) for s in self.stops if s in text), default=-1)
        return None if cut < 0 else text[len(self.text) : cut]


async def _sse(run: _Run, rid: str, created: int, body: _Body, chat: bool) -> AsyncIterator[bytes]:
    def frame(
        delta_text: str | None, ids: list[int], finish: str | None, role: bool = False
    ) -> bytes:
        if chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if delta_text is not None:
                delta["content"] = delta_text
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "finish_reason": finish,
                "logprobs": None,
            }
        else:
            choice = {
                "index": 0,
                "text": delta_text or "",
                "finish_reason": finish,
                "logprobs": None,
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
        return f"data: {json.dumps(obj)}\n\n".encode()

    if chat:
        yield frame("", [], None, role=True)
    try:
        async for piece, ids in run.text_pieces():
            yield frame(piece, ids, None)
    except RequestRejected as exc:
        err = {"error": {"message": str(exc), "type": "server_error", "code": exc.status}}
        yield f"data: {json.dumps(err)}\n\n".encode()
        return
    yield frame(None if chat else "", [], run.finish_reason)
    yield b"data: [DONE]\n\n"
