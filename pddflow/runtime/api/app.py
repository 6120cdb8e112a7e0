"""The OpenAI-compatible HTTP API (docs/runtime.md, API): it only translates HTTP to the `Router`
protocol (router.py), so any router can serve it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from pddflow.core.payloads import SamplingParams
from pddflow.runtime.api.admin import Scaler, add_admin_routes, add_pool_routes
from pddflow.runtime.api.admission import Admission
from pddflow.runtime.api.api_metrics import ApiMetrics
from pddflow.runtime.api.auth import KeyGuard
from pddflow.runtime.api.completion import (
    Choices,
    ClientGone,
    Completion,
    CompletionResponse,
    OutputOptions,
    on_disconnect,
    sse,
)
from pddflow.runtime.api.errors import (
    error_response,
    short_repr,
    validation_error,
)
from pddflow.runtime.api.forward import RouterHttp, add_admin_forward
from pddflow.runtime.api.logprobs import chat_logprobs, completion_logprobs
from pddflow.runtime.api.router import LinkControl, Router
from pddflow.runtime.api.schema import SEED_LIMIT, ChatBody, CompletionBody, FieldError, _Body
from pddflow.runtime.api.structured import ResponseGrammars
from pddflow.runtime.api.tools import ToolUse
from pddflow.runtime.frontend.rejection import RequestRejected

DEFAULT_TIMEOUT_S = 300.0
CLIENT_CLOSED = 499  # no one reads it: the client has gone (nginx's code for that)


def make_app(
    router: Router,
    admission: Admission | None = None,
    api_key: str | None = None,
    admin_key: str | None = None,
    links: LinkControl | None = None,
    placement: Callable[[], dict[str, Any]] | None = None,
    scale: Scaler | None = None,
    forward: str | None = None,
) -> FastAPI:
    """`admission` (app.state.admission) is what a shutdown drains. `api_key` guards /v1/*
    (docs/openai-api.md). Given an `admin_key`, `links` serves /admin/links/{name}/cut (where it
    can), .../degrade and .../restore: drills on the emulated WAN (admin.py); `scale`, POST
    /admin/pools/{operator} (live scaling). `placement` (the backend's `describe`) adds each
    instance's node and address and each channel's transport to /health. `forward` (an API
    process of several: the router's internal URL) answers /health, /metrics, timelines and the
    admin endpoints from the router (forward.py)."""
    admission = admission or Admission()
    grammars = ResponseGrammars(router.tokenizer, router.vocab_size)
    shapes = ApiMetrics()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # reports are handled on the server's loop from now on
        router.attach(asyncio.get_running_loop())
        yield

    app = FastAPI(
        title="pddflow",
        description="OpenAI-compatible API of a pddflow deployment",
        lifespan=lifespan,
    )
    app.state.admission = admission
    app.add_middleware(KeyGuard, api_key=api_key or None, admin_key=admin_key or None)

    @app.exception_handler(RequestValidationError)
    async def _bad_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _httperror_response(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            msg, kind = f"no such endpoint: {short_repr(request.url.path)}", "not_found_error"
        elif exc.status_code == 405:
            msg = f"method {request.method} is not allowed on {short_repr(request.url.path)}"
            kind = "invalid_request_error"
        else:
            msg, kind = str(exc.detail), "invalid_request_error"
        kind = kind if exc.status_code < 500 else "server_error"
        return error_response(exc.status_code, msg, kind=kind, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(exc).__name__}", kind="server_error")

    deployment = RouterHttp(forward) if forward else None

    @app.get("/health")
    async def health(request: Request) -> Response:
        if deployment is not None:
            if not admission.open:
                return JSONResponse({"status": "draining"}, status_code=503)
            return await deployment.ask(request)
        ready, detail = router.health()
        if placement is not None:
            detail = with_placement(detail, placement())
        if not admission.open:
            ready, detail = False, {**detail, "status": "draining"}
        return JSONResponse(detail, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if deployment is not None:  # the API's own counters are this process's
            return await deployment.ask(request, shapes.text())
        body, ctype = router.metrics_text()
        return Response(body + shapes.text(), media_type=ctype)

    if admin_key and deployment is not None:
        add_admin_forward(app, deployment)
    if admin_key and links is not None:
        add_admin_routes(app, links)
    if admin_key and scale is not None:
        add_pool_routes(app, scale)

    def served_model() -> dict[str, Any]:
        return {
            "id": router.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "pddflow",
            "max_model_len": router.max_context,
        }

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [served_model()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> JSONResponse:
        if model != router.model_id:
            return error_response(
                404,
                f"model {short_repr(model)} is not served here; it serves {router.model_id!r}",
                kind="not_found_error",
                param="model",
                code="model_not_found",
            )
        return JSONResponse(served_model())

    @app.get("/v1/requests/{request_id}/timeline")
    async def timeline(request_id: str, request: Request) -> Response:
        if deployment is not None:
            return await deployment.ask(request)
        t = router.timeline(request_id)
        if t is None:
            return error_response(
                404,
                f"no request {short_repr(request_id)} (timelines of the most recent requests "
                "are kept)",
                kind="not_found_error",
            )
        return JSONResponse(t)

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request) -> Response:
        if not admission.open:
            return error_response(503, admission.refusal or "", kind="server_error")
        try:
            prompt_ids = _prompt_ids(router, body.prompt)
        except RequestRejected as exc:
            return error_response(exc.status, str(exc), param="prompt")
        out = await _serve(router, admission, grammars, request, body, prompt_ids, chat=False)
        if out.status_code == 200:
            shapes.requested(body.response_format and body.response_format.type, None)
        return out

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody, request: Request) -> Response:
        if not admission.open:
            return error_response(503, admission.refusal or "", kind="server_error")
        tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
        try:
            ids = router.chat_prompt_ids(body.messages, tools or None)
        except ValueError as exc:
            return error_response(400, str(exc), param="messages")
        except RequestRejected as exc:
            return error_response(exc.status, str(exc), param="messages")
        tool_use = None
        if tools and body.tool_mode != "none":
            parallel = body.parallel_tool_calls is not False
            tool_use = ToolUse(tools, router.tool_format, body.tool_mode, parallel)
            tool_use.answered = shapes.tool_answers.inc
        out = await _serve(router, admission, grammars, request, body, ids, True, tool_use)
        if out.status_code == 200:
            fmt = body.response_format and body.response_format.type
            shapes.requested(fmt, body.tool_mode if tools else None)
        return out

    return app


def _prompt_ids(router: Router, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        return router.tokenizer.encode(prompt)
    if prompt and (min(prompt) < 0 or max(prompt) >= router.vocab_size):  # in C, not a loop
        bad = [t for t in prompt if not 0 <= t < router.vocab_size]
        raise RequestRejected(
            400, f"token id {bad[0]} is outside the vocabulary [0, {router.vocab_size})"
        )
    return list(prompt)


async def _serve(
    router: Router,
    admission: Admission,
    grammars: ResponseGrammars,
    request: Request,
    body: _Body,
    prompt_ids: list[int],
    chat: bool,
    tool_use: ToolUse | None = None,
) -> Response:
    if body.model != router.model_id:
        return error_response(
            404,
            f"model {short_repr(body.model)} is not served here; it serves {router.model_id!r}",
            kind="not_found_error",
            param="model",
            code="model_not_found",
        )
    # the context, or what the smallest decoder's KV memory holds if less (admission's limit)
    room = router.max_context
    kv_room = router.max_serving_tokens()
    if kv_room is not None:
        room = min(room, kv_room)
    max_tokens = body.token_budget(room - len(prompt_ids))
    if len(prompt_ids) + max_tokens > router.max_context:
        return error_response(
            400,
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
            f"context of {router.max_context} tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )
    if body.min_tokens > max_tokens:
        return error_response(
            400,
            f"min_tokens: {body.min_tokens} is more than max_tokens ({max_tokens})",
            param="min_tokens",
        )
    stops = body.stops
    try:
        stop_ids = body.stop_ids(router.tokenizer.eos_token_ids, router.vocab_size)
        grammar = grammars.grammar(body.response_format)
        if tool_use is not None and grammar is None:
            grammar = grammars.checked(tool_use.grammar, "tools")
    except FieldError as exc:
        return error_response(400, str(exc), param=exc.field)
    output = OutputOptions(
        frozenset(stop_ids),
        body.min_tokens,
        body.skip_special_tokens,
        body.include_stop_str_in_output,
    )
    n = body.n or 1
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop_token_ids=stop_ids,
        min_tokens=body.min_tokens,
        # best_of ranks candidates by their tokens' log probabilities: asked for even where the
        # client did not ask to see them
        logprobs=0 if body.logprob_count is None and body.candidates > n else body.logprob_count,
        grammar=grammar,
        **body.sampling_fields(),
    )
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    deadline = time.monotonic() + (body.timeout_s or DEFAULT_TIMEOUT_S)
    # choice i > 0 is its own flight, rid-i, seeded seed + i (vLLM's), its timeline its own;
    # best_of: `candidates` flights, the best n of them returned
    choices = Choices(
        [
            Completion(router, choice_id(rid, i), stops, max_tokens, admission, output)
            for i in range(body.candidates)
        ]
    )
    try:
        for c in choices.items:
            admission.admit(c)
    except RequestRejected as exc:
        await choices.close()
        return error_response(exc.status, str(exc), kind="server_error")
    # A client that hangs up cancels the request (every leg aborted, its KV freed). Starlette
    # watches for that while it streams; until then, and for a whole non-streamed answer, this
    # watches the same way (the next ASGI receive after the body is the disconnect).
    watch = asyncio.create_task(on_disconnect(request, choices))
    streaming = False
    try:

        def start(i: int) -> Completion:
            c = choices.items[i]
            seed = None if sampling.seed is None else (sampling.seed + i) % SEED_LIMIT
            mine = replace(sampling, seed=seed)
            c.stream = router.generate(
                c.rid, prompt_ids, mine, deadline, body.variant, body.handoff
            )
            return c

        # rejections (bad variant, overload) surface before any byte is sent. The first choice
        # goes first: its prefill leaves the prompt's KV in the prefix caches the others hit.
        first = start(0)
        first.first = await first.next_chunk()
        rest = [start(i) for i in range(1, body.candidates)]
        firsts = await asyncio.gather(*(c.next_chunk() for c in rest), return_exceptions=True)
        for c, chunk in zip(rest, firsts):
            if isinstance(chunk, BaseException):  # the others end with the request (close)
                raise chunk
            c.first = chunk
        created = int(time.time())
        if body.stream:
            watch.cancel()
            streaming = True
            return CompletionResponse(
                choices,
                sse(
                    choices,
                    rid,
                    created,
                    body,
                    chat,
                    lambda: _usage(router, rid, prompt_ids, choices),
                    tool_use,
                ),
                media_type="text/event-stream",
                headers={"X-Request-Id": rid},
            )
        await choices.read_all()
    except RequestRejected as exc:
        out = error_response(
            exc.status,
            str(exc),
            kind="invalid_request_error" if exc.status < 500 else "server_error",
        )
        if exc.retry_after_s is not None:
            out.headers["Retry-After"] = str(exc.retry_after_s)
        return out
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        watch.cancel()
        if not streaming:
            await choices.close()
    return JSONResponse(
        {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": router.model_id,
            "choices": [
                _choice(router, body, chat, i, c, tool_use) for i, c in enumerate(choices.best(n))
            ],
            "usage": _usage(router, rid, prompt_ids, choices),
        },
        headers={"X-Request-Id": rid},
    )


def choice_id(rid: str, index: int) -> str:
    """The flight (and timeline) of choice `index` of request rid: rid itself for the first."""
    return rid if index == 0 else f"{rid}-{index}"


def _choice(
    router: Router, body: _Body, chat: bool, index: int, c: Completion, tool_use: ToolUse | None
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "finish_reason": c.finish_reason, "logprobs": None}
    if body.logprob_count is not None:
        tok = router.tokenizer
        choice["logprobs"] = (
            chat_logprobs(tok, c.ids, c.lps)
            if chat
            else completion_logprobs(tok, c.ids, c.lps, 0)[0]
        )
    if chat:
        choice["message"] = {"role": "assistant", "content": c.text}
        content, calls = c.answer(tool_use)
        if calls:
            choice["finish_reason"] = "tool_calls"
            choice["message"] = {
                "role": "assistant",
                "content": content,
                "tool_calls": [call.openai() for call in calls],
            }
    else:
        choice["text"] = c.text
    if body.return_token_ids:
        choice["token_ids"] = c.ids
    return choice


def _usage(router: Router, rid: str, prompt_ids: list[int], choices: Choices) -> dict[str, Any]:
    """The prompt once, every choice's output; cached: the first choice's (the others hit what
    it left)."""
    generated = sum(len(c.ids) for c in choices.items)
    return {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": generated,
        "total_tokens": len(prompt_ids) + generated,
        "prompt_tokens_details": {"cached_tokens": router.cached_tokens(rid)},
    }


def with_placement(detail: dict[str, Any], placed: dict[str, Any]) -> dict[str, Any]:
    """/health's body with the backend's word on each instance (node, address) and channel."""
    where = placed.get("workers", {})
    workers = {i: {**w, **where.get(i, {})} for i, w in detail.get("workers", {}).items()}
    return {
        **detail,
        "backend": placed["backend"],
        "workers": workers,
        "channels": placed["channels"],
        **({"api_servers": placed["api_servers"]} if "api_servers" in placed else {}),
        **({"link_process": placed["link_process"]} if "link_process" in placed else {}),
    }
