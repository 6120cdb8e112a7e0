"""The OpenAI API's surface without a deployment: the strict schema (every request field honoured
or refused with a 400 naming it), the error shape of every failure, usage, the chat default of
max_tokens and the API keys; make_app over a fake frontend. test_openai_api.py covers the same
paths on a real deployment with the official client."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pddflow.core.payloads import SamplingParams, TokenChunk, TokenLogprob
from pddflow.graph import load_plan
from pddflow.graph.shipped import resolve_graph
from pddflow.runtime.api.app import make_app
from pddflow.runtime.frontend.chat_template import render_chat
from pddflow.runtime.frontend.flight import cached_tokens
from pddflow.runtime.frontend.link_admin import LinkAdmin
from pddflow.runtime.frontend.rejection import RequestRejected


class ByteTokenizer:
    eos_token_ids = (0,)

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode(errors="replace")

    def token_bytes(self, token_id: int) -> bytes:  # what structured output reads
        return bytes([token_id]) if token_id else b""


TWO_TOOLS = [
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
    {
        "type": "function",
        "function": {
            "name": "g",
            "description": "adds",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    },
]


class FakeFrontend:
    model_id = "fake"
    tokenizer = ByteTokenizer()
    vocab_size = 256
    max_context = 512

    def __init__(self) -> None:
        self.sampling: list[SamplingParams] = []
        self.timelines: dict[str, dict] = {}
        self.ended: list[str] = []  # request ids whose stream ended (finished or cancelled)

    def attach(self, loop: Any) -> None:
        pass

    def health(self) -> tuple[bool, dict]:
        return True, {"status": "ok"}

    def metrics_text(self) -> tuple[bytes, str]:
        return b"# metrics\n", "text/plain"

    def timeline(self, request_id: str) -> dict | None:
        return self.timelines.get(request_id)

    def cached_tokens(self, request_id: str) -> int:
        return cached_tokens(self.timeline(request_id))

    tool_format = "hermes"

    def chat_prompt_ids(self, messages: list, tools: list | None = None) -> list[int]:
        return self.tokenizer.encode(render_chat(messages, tools))

    def stopped(self, request_id: str) -> None:
        pass

    def max_serving_tokens(self) -> int | None:
        return None

    async def generate(self, request_id, prompt_ids, sampling, deadline, variant, handoff):
        try:
            async for chunk in self._generate(request_id, sampling):
                yield chunk
        finally:
            self.ended.append(request_id)

    async def _generate(self, request_id, sampling):
        self.sampling.append(sampling)
        self.timelines[request_id] = {
            "events": [
                {"event": "arrival", "predicted_hit_tokens": 16},
                {"event": "kv_send", "cached_tokens": 32},
            ]
        }
        for i in range(sampling.max_tokens):
            tok = ord("a") + i % 26
            if sampling.logprobs is None:
                yield [tok]
                continue
            # the sampled token first, then the next ids: logprob -(rank + 1) / 10
            top = tuple((tok + r, -(r + 1) / 10) for r in range(sampling.logprobs))
            yield TokenChunk([tok], [TokenLogprob(-0.1, top)])


class Backend:
    """A backend whose relays can cut link A-B (the local backend's `cut_link`)."""

    def __init__(self) -> None:
        self.cuts: list[tuple] = []

    def cut_link(self, name: str, seconds: float, after_bytes: int) -> None:
        if name != "A-B":
            raise KeyError(f"no link {name!r}")
        self.cuts.append((name, seconds, after_bytes))


@pytest.fixture
def fe() -> FakeFrontend:
    return FakeFrontend()


@pytest.fixture
def api(fe) -> TestClient:
    with TestClient(make_app(fe)) as c:
        yield c


COMPLETION = {"model": "fake", "prompt": "hello", "max_tokens": 3}
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _assert_openai_error(r, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"seed": True}, "seed"),
        ({"stream": "yes"}, "stream"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": 5.0}, "max_tokens"),
        ({"temperature": "0"}, "temperature"),
        ({"stop": ""}, "stop"),
        ({"stop": ["ok", ""]}, "stop.1"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"n": 17}, "n"),  # at most 16 choices
        ({"n": 0}, "n"),
        ({"best_of": 2, "n": 3}, "best_of"),  # at least n
        ({"best_of": 3, "stream": True}, "best_of"),  # the best are known at the end
        ({"best_of": 3, "temperature": 0}, "best_of"),  # greedy candidates are one
        ({"best_of": 17}, "best_of"),
        ({"echo": True}, "echo"),
        ({"suffix": "tail"}, "suffix"),
        ({"logprobs": 6}, "logprobs"),  # at most 5 alternatives (OpenAI's limit)
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": True}, "logprobs"),  # no coercion: true is no count
        ({"frequency_penalty": 2.01}, "frequency_penalty"),  # OpenAI's range: [-2, 2]
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"frequency_penalty": "1"}, "frequency_penalty"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
        (
            {"stream": True, "stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
        ),
        ({"top_k": 1.5}, "top_k"),  # vLLM's: an integer
        ({"min_p": -0.1}, "min_p"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"user": 5}, "user"),
        ({"tools": [{"type": "function"}]}, "tools"),  # a chat field
        # vLLM's extensions
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 4}, "min_tokens"),  # more than max_tokens (3)
        ({"stop_token_ids": [256]}, "stop_token_ids.0"),  # outside the vocabulary
        ({"stop_token_ids": [5, -1]}, "stop_token_ids.1"),
        ({"skip_special_tokens": 1}, "skip_special_tokens"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"guided_json": {"type": "object"}}, "guided_json"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
    ],
)
def test_completion_fields_refused_with_400_naming_them(api, extra, param):
    err = _assert_openai_error(api.post("/v1/completions", json={**COMPLETION, **extra}), 400)
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert err["message"].startswith(f"{param}: ")


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools.0.function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        ({"tool_choice": "auto"}, "tool_choice"),  # without tools
        ({"tools": TWO_TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"tools": TWO_TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice.function.name",
        ),
        ({"tools": TWO_TOOLS + TWO_TOOLS[:1]}, "tools"),  # a name twice
        (
            {
                "tools": TWO_TOOLS,
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "tool_choice",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "nonsense"}},
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
        ),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_object", "json_schema": {"name": "x"}}},
            "response_format.json_schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"logprobs": 1}, "logprobs"),  # a boolean here, no coercion
        ({"top_logprobs": 2}, "top_logprobs"),  # only with logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),  # at most 20
        ({"n": 2.0}, "n"),  # an integer
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"store": True}, "store"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"max_completion_tokens": "4"}, "max_completion_tokens"),
        ({"best_of": 1}, "best_of"),  # a completions field
        ({"echo": False}, "echo"),
        ({"messages": [{"role": "user", "content": "x", "extra": 1}]}, "messages.0.extra"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        ({"messages": [{"role": "user"}]}, "messages.0.content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content.0.type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages.0.content.0",
        ),
        (
            {"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}]},
            "messages.0.tool_calls.0.function",
        ),
    ],
)
def test_chat_fields_refused_with_400_naming_them(api, extra, param):
    err = _assert_openai_error(api.post("/v1/chat/completions", json={**CHAT, **extra}), 400)
    assert err["param"] == param and err["message"].startswith(f"{param}: ")


@pytest.mark.parametrize(
    "path, body, words",
    [
        ("completions", {"prompt": {"a": 1}}, "prompt: must be a string, a list of token IDs"),
        ("completions", {"prompt": [1, "a"]}, "prompt: must be a string, a list of token IDs"),
        ("completions", {"prompt": "x", "stop": 5}, "stop: must be a string or a list"),
        ("chat/completions", {"messages": [{"role": "user", "content": 5}]}, "must be a string"),
    ],
)
def test_type_errors_say_what_the_field_takes(api, path, body, words):
    r = api.post(f"/v1/{path}", json={"model": "fake", **body})
    assert words in _assert_openai_error(r, 400)["message"]


def test_a_body_that_is_no_json_object(api):
    for data, ctype in ((b'{"model": "fake"}', "text/plain"), (b"[1]", "application/json")):
        r = api.post("/v1/completions", content=data, headers={"content-type": ctype})
        assert "must be a JSON object" in _assert_openai_error(r, 400)["message"]


def test_neutral_values_of_unsupported_fields_pass(api, fe):
    neutral = {
        "n": 1,
        "best_of": 1,
        "echo": False,
        "suffix": None,
        "logprobs": None,
        "frequency_penalty": 0,
        "presence_penalty": 0.0,
        "logit_bias": {},
        "user": "someone",
        # vLLM's, at their defaults
        "use_beam_search": False,
        "length_penalty": 1.0,
        "spaces_between_special_tokens": True,
        "prompt_logprobs": None,
        "ignore_eos": False,
        "min_tokens": 0,
        "stop_token_ids": [],
        "skip_special_tokens": True,
        "include_stop_str_in_output": False,
    }
    r = api.post("/v1/completions", json={**COMPLETION, **neutral})
    assert r.status_code == 200, r.text
    chat_neutral = {
        "n": 1,
        "logprobs": False,
        "tools": [],
        "tool_choice": "none",
        "response_format": {"type": "text"},
        "store": False,
        "service_tier": "auto",
        "parallel_tool_calls": True,
        "metadata": {"k": "v"},
        "prompt_cache_key": "session-1",
        "safety_identifier": "u1",
        "user": "someone",
        "modalities": ["text"],
    }
    r = api.post("/v1/chat/completions", json={**CHAT, **chat_neutral})
    assert r.status_code == 200, r.text


def test_honoured_fields(api, fe):
    r = api.post(
        "/v1/completions",
        json={**COMPLETION, "temperature": 0, "top_p": 0.5, "seed": 7, "max_tokens": 5},
    )
    assert r.status_code == 200
    s = fe.sampling[-1]
    assert (s.temperature, s.top_p, s.seed, s.max_tokens) == (0.0, 0.5, 7, 5)
    assert r.json()["choices"][0]["text"] == "abcde"
    assert (s.frequency_penalty, s.presence_penalty, s.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (s.top_k, s.min_p) == (0, 0.0)
    penalties = {"frequency_penalty": 0.5, "presence_penalty": -1, "repetition_penalty": 1.2}
    filters = {"top_k": 40, "min_p": 0.1}
    for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        r = api.post(path, json={**body, **penalties, **filters})
        assert r.status_code == 200, r.text
        s = fe.sampling[-1]
        assert (s.frequency_penalty, s.presence_penalty, s.repetition_penalty) == (0.5, -1, 1.2)
        assert (s.top_k, s.min_p) == (40, 0.1)
    api.post("/v1/completions", json={**COMPLETION, "top_k": -1})  # vLLM's "all"
    assert fe.sampling[-1].top_k == 0
    r = api.post("/v1/completions", json={**COMPLETION, "max_tokens": 6, "stop": ["d"]})
    body = r.json()
    assert body["choices"][0]["text"] == "abc" and body["choices"][0]["finish_reason"] == "stop"
    # chat: max_completion_tokens over max_tokens
    r = api.post("/v1/chat/completions", json={**CHAT, "max_completion_tokens": 2})
    assert fe.sampling[-1].max_tokens == 2
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": "ab"}


def test_vllm_bench_serve_request_passes(api, fe):
    """The body `vllm bench serve --ignore-eos` sends: EOS is then no stop token."""
    body = {
        "model": "fake",
        "prompt": "hello",
        "repetition_penalty": 1.0,
        "max_tokens": 5,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    r = api.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert fe.sampling[-1].stop_token_ids == () and fe.sampling[-1].max_tokens == 5
    chunks = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
    assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_vllm_stop_fields(api, fe):
    r = api.post("/v1/completions", json={**COMPLETION, "min_tokens": 2, "stop_token_ids": [99]})
    s = fe.sampling[-1]
    assert r.status_code == 200 and (s.stop_token_ids, s.min_tokens) == ((0, 99), 2)
    # stop strings count only past min_tokens: "b" (the 2nd token) does not end it, "d" does
    six = {**COMPLETION, "max_tokens": 6}
    r = api.post("/v1/completions", json={**six, "stop": ["b"], "min_tokens": 3})
    assert r.json()["choices"][0]["text"] == "abcdef"
    assert r.json()["choices"][0]["finish_reason"] == "length"
    r = api.post("/v1/completions", json={**six, "stop": ["b", "d"], "min_tokens": 3})
    assert r.json()["choices"][0]["text"] == "abc"
    # include_stop_str_in_output: the stop that ended it is part of the text
    r = api.post(
        "/v1/completions",
        json={**six, "stop": ["d"], "min_tokens": 3, "include_stop_str_in_output": True},
    )
    assert r.json()["choices"][0]["text"] == "abcd"
    assert r.json()["choices"][0]["finish_reason"] == "stop"


def test_max_tokens_defaults(api, fe):
    body = {k: v for k, v in COMPLETION.items() if k != "max_tokens"}
    assert api.post("/v1/completions", json=body).status_code == 200
    assert fe.sampling[-1].max_tokens == 16  # OpenAI's completions default
    body = {k: v for k, v in CHAT.items() if k != "max_tokens"}
    r = api.post("/v1/chat/completions", json=body)
    prompt = r.json()["usage"]["prompt_tokens"]
    assert fe.sampling[-1].max_tokens == FakeFrontend.max_context - prompt  # the rest


def test_context_length_exceeded(api):
    r = api.post("/v1/completions", json={**COMPLETION, "max_tokens": 510})
    err = _assert_openai_error(r, 400, "max_tokens")
    assert err["code"] == "context_length_exceeded" and "context of 512" in err["message"]


def test_usage_with_cached_tokens(api):
    u = api.post("/v1/completions", json=COMPLETION).json()["usage"]
    assert u == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 32},  # prefill's measured count
    }
    assert cached_tokens({"events": [{"event": "arrival", "predicted_hit_tokens": 16}]}) == 16
    assert cached_tokens(None) == 0


def _sse(r) -> list[Any]:
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.mark.parametrize("path, body", [("completions", COMPLETION), ("chat/completions", CHAT)])
def test_stream_include_usage(api, path, body):
    r = api.post(
        f"/v1/{path}",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    events = _sse(r)
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3
    assert last["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
    assert all(e["usage"] is None for e in events[:-2])
    plain = _sse(api.post(f"/v1/{path}", json={**body, "stream": True}))
    assert all("usage" not in e for e in plain[:-1])


@pytest.mark.parametrize("path, body", [("completions", COMPLETION), ("chat/completions", CHAT)])
def test_continuous_usage_counts_every_chunk(api, path, body):
    """vLLM's stream_options.continuous_usage_stats (guidellm sends it): every chunk carries the
    usage so far; without include_usage it adds nothing."""
    opts = {"include_usage": True, "continuous_usage_stats": True}
    events = _sse(api.post(f"/v1/{path}", json={**body, "stream": True, "stream_options": opts}))
    counts = [e["usage"]["completion_tokens"] for e in events[:-1]]
    assert counts == sorted(counts) and counts[-1] == 3
    assert counts[-2] == 3 and events[-2]["choices"] == []  # the last chunk: the whole usage
    prompt = events[-2]["usage"]["prompt_tokens"]
    assert all(e["usage"]["prompt_tokens"] == prompt for e in events[:-1])
    with_tokens = [e for e in events[:-2] if e["choices"] and e["choices"][0].get("token_ids")]
    for e in with_tokens:  # a chunk's own tokens are counted in its usage
        assert e["usage"]["completion_tokens"] >= len(e["choices"][0]["token_ids"])
    alone = {"continuous_usage_stats": True}
    plain = _sse(api.post(f"/v1/{path}", json={**body, "stream": True, "stream_options": alone}))
    assert all("usage" not in e for e in plain[:-1])


def test_every_error_in_the_openai_shape_and_bounded(api):
    big = "m" * 1_000_000
    r = api.post("/v1/completions", json={**COMPLETION, "model": big})
    err = _assert_openai_error(r, 404, "model")
    assert len(r.content) < 2000 and err["code"] == "model_not_found"
    r = api.post("/v1/completions", json={**COMPLETION, big: 1})
    assert len(r.content) < 2000
    _assert_openai_error(r, 400)
    r = api.post(
        "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert "not valid JSON" in _assert_openai_error(r, 400)["message"]
    _assert_openai_error(api.post("/v1/completions", json=[1, 2]), 400)
    _assert_openai_error(api.post("/v1/nowhere", json={}), 404)
    _assert_openai_error(api.get("/" + "x" * 30_000), 404)
    assert len(api.get("/" + "x" * 30_000).content) < 2000
    err = _assert_openai_error(api.get("/v1/completions"), 405)
    assert "GET" in err["message"]
    _assert_openai_error(api.get("/v1/requests/nope/timeline"), 404)
    assert api.get("/v1/models/fake").json()["id"] == "fake"
    _assert_openai_error(api.get("/v1/models/other/x"), 404, "model")
    # the admin endpoints do not exist without an admin key
    _assert_openai_error(api.post("/admin/links/A-B/cut", json={"seconds": 1}), 404)


def test_api_key(fe):
    with TestClient(make_app(fe, api_key="sesame")) as c:
        for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
            err = _assert_openai_error(c.post(path, json=body), 401)
            assert err["code"] == "invalid_api_key" and "missing" in err["message"]
            r = c.post(path, json=body, headers={"Authorization": "Bearer wrong"})
            assert _assert_openai_error(r, 401)["message"] == "invalid API key"
            r = c.post(path, json=body, headers={"Authorization": "Bearer sesame"})
            assert r.status_code == 200
        _assert_openai_error(c.get("/v1/models"), 401)
        _assert_openai_error(c.post("/v1/completions", content=b"{bad"), 401)  # before parsing
        assert c.get("/v1/models", headers={"Authorization": "Bearer sesame"}).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200


def test_admin_key(fe):
    be = Backend()
    links = LinkAdmin(load_plan(str(resolve_graph("pdd"))), {}, be.cut_link)
    with TestClient(make_app(fe, api_key="sesame", admin_key="root", links=links)) as c:
        cut = {"seconds": 2}
        _assert_openai_error(c.post("/admin/links/A-B/cut", json=cut), 401)
        # the API key is not the admin key
        r = c.post("/admin/links/A-B/cut", json=cut, headers={"Authorization": "Bearer sesame"})
        _assert_openai_error(r, 401)
        r = c.post("/admin/links/A-B/cut", json=cut, headers={"Authorization": "Bearer root"})
        assert r.status_code == 200 and be.cuts == [("A-B", 2, 0)]
        r = c.post("/admin/links/X/cut", json=cut, headers={"Authorization": "Bearer root"})
        _assert_openai_error(r, 404, "name")
        # and the admin key is not the API key
        r = c.post("/v1/completions", json=COMPLETION, headers={"Authorization": "Bearer root"})
        _assert_openai_error(r, 401)


def test_completion_logprobs_shape(api, fe):
    r = api.post("/v1/completions", json={**COMPLETION, "logprobs": 2})
    assert r.status_code == 200, r.text
    assert fe.sampling[-1].logprobs == 2
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"] == ["a", "b", "c"]
    assert lp["token_logprobs"] == [-0.1, -0.1, -0.1]
    assert lp["top_logprobs"] == [
        {"a": -0.1, "b": -0.2},
        {"b": -0.1, "c": -0.2},
        {"c": -0.1, "d": -0.2},
    ]
    assert lp["text_offset"] == [0, 1, 2]
    # 0: the sampled token's alone (it is in top_logprobs, as vLLM gives it)
    lp = api.post("/v1/completions", json={**COMPLETION, "logprobs": 0}).json()["choices"][0]
    assert lp["logprobs"]["top_logprobs"] == [{"a": -0.1}, {"b": -0.1}, {"c": -0.1}]
    # not asked: nothing computed, null
    assert api.post("/v1/completions", json=COMPLETION).json()["choices"][0]["logprobs"] is None
    assert fe.sampling[-1].logprobs is None


def test_chat_logprobs_shape(api, fe):
    r = api.post("/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 2})
    assert r.status_code == 200, r.text
    assert fe.sampling[-1].logprobs == 2
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["a", "b", "c"]
    assert content[0] == {
        "token": "a",
        "logprob": -0.1,
        "bytes": [97],
        "top_logprobs": [
            {"token": "a", "logprob": -0.1, "bytes": [97]},
            {"token": "b", "logprob": -0.2, "bytes": [98]},
        ],
    }
    r = api.post("/v1/chat/completions", json={**CHAT, "logprobs": True})
    assert fe.sampling[-1].logprobs == 0
    assert [c["top_logprobs"] for c in r.json()["choices"][0]["logprobs"]["content"]] == [[]] * 3
    r = api.post("/v1/chat/completions", json={**CHAT, "logprobs": False, "top_logprobs": 0})
    assert r.json()["choices"][0]["logprobs"] is None and fe.sampling[-1].logprobs is None


def test_streamed_chunks_carry_their_tokens_logprobs(api):
    r = api.post("/v1/completions", json={**COMPLETION, "logprobs": 1, "stream": True})
    chunks = [e["choices"][0] for e in _sse(r)[:-1] if e["choices"][0]["text"]]
    assert [c["logprobs"]["tokens"] for c in chunks] == [["a"], ["b"], ["c"]]
    assert [c["logprobs"]["text_offset"] for c in chunks] == [[0], [1], [2]]  # whole-output offsets
    r = api.post(
        "/v1/chat/completions",
        json={**CHAT, "logprobs": True, "top_logprobs": 1, "stream": True},
    )
    deltas = [e["choices"][0] for e in _sse(r)[:-1] if e["choices"][0]["delta"].get("content")]
    assert [d["logprobs"]["content"][0]["token"] for d in deltas] == ["a", "b", "c"]
    assert all(len(d["logprobs"]["content"][0]["top_logprobs"]) == 1 for d in deltas)


def test_token_text_of_a_partial_utf8_byte():
    from pddflow.operators.tokenizer import ByteTokenizer as Bytes
    from pddflow.runtime.api.logprobs import chat_logprobs, token_text

    assert token_text(Bytes(), 0xE2) == ("\ufffd", [0xE2])  # the raw byte; text: a replacement
    assert token_text(Bytes(), Bytes.EOS) == ("", [])
    out = chat_logprobs(Bytes(), [0xE2], [TokenLogprob(-1.0, ((0xE2, -1.0),))])
    assert out["content"][0]["bytes"] == [0xE2] and out["content"][0]["token"] == "\ufffd"


def test_n_choices_each_a_flight_with_its_own_seed(api, fe):
    """n: each choice its own flight (rid, rid-1, ...) seeded seed + i; one choice per index,
    usage counts the prompt once and every choice's tokens."""
    r = api.post("/v1/completions", json={**COMPLETION, "n": 3, "seed": 40, "max_tokens": 4})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["text"] == "abcd" and c["finish_reason"] == "length" for c in body["choices"])
    assert sorted(s.seed for s in fe.sampling[-3:]) == [40, 41, 42]
    rid = r.headers["x-request-id"]
    assert set(fe.timelines) >= {rid, f"{rid}-1", f"{rid}-2"}
    assert body["usage"]["completion_tokens"] == 12
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 12
    # chat, no seed: every choice draws its own (the engine picks one per sequence)
    r = api.post("/v1/chat/completions", json={**CHAT, "n": 2, "max_tokens": 3})
    assert [c["message"]["content"] for c in r.json()["choices"]] == ["abc", "abc"]
    assert [s.seed for s in fe.sampling[-2:]] == [None, None]


def test_n_choices_streamed(api, fe):
    """Streamed: each choice's chunks carry its index, each choice ends with its own
    finish_reason chunk, and the usage chunk comes once, last."""
    body = {**CHAT, "n": 2, "max_tokens": 3, "stream": True}
    body["stream_options"] = {"include_usage": True}
    r = api.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    text = {0: "", 1: ""}
    finishes = {}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        text[choice["index"]] += choice["delta"].get("content") or ""
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert text == {0: "abc", 1: "abc"} and finishes == {0: "length", 1: "length"}
    roles = [
        c["choices"][0]["index"]
        for c in chunks
        if c["choices"] and "role" in c["choices"][0]["delta"]
    ]
    assert roles == [0, 1]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


def test_response_format_becomes_the_grammar_every_worker_applies(api, fe):
    """json_object and json_schema reach the router as a grammar (on both endpoints; the
    schema compiled once here); text and no format as none."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
    for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        assert api.post(path, json={**body, "response_format": fmt}).status_code == 200
        assert '"required": ["a"]' in fe.sampling[-1].grammar
        assert api.post(path, json={**body, "response_format": {"type": "json_object"}})
        assert '"type": "object"' in fe.sampling[-1].grammar
        api.post(path, json={**body, "response_format": {"type": "text"}})
        assert fe.sampling[-1].grammar is None
        api.post(path, json=body)
        assert fe.sampling[-1].grammar is None


def test_tools_reach_the_template_and_a_forced_choice_the_grammar(api, fe):
    """auto: the tools rendered, no grammar; a named function or required: a grammar of calls
    of it (of them); none: rendered, nothing forced; a conversation with a call and its result
    is taken."""
    body = {**CHAT, "tools": TWO_TOOLS}
    assert api.post("/v1/chat/completions", json=body).status_code == 200
    assert fe.sampling[-1].grammar is None
    named = {"type": "function", "function": {"name": "g"}}
    assert api.post("/v1/chat/completions", json={**body, "tool_choice": named}).status_code == 200
    grammar = fe.sampling[-1].grammar
    assert '"const": "g"' in grammar and '"const": "f"' not in grammar
    assert api.post("/v1/chat/completions", json={**body, "tool_choice": "required"})
    assert '"const": "g"' in fe.sampling[-1].grammar and '"const": "f"' in fe.sampling[-1].grammar
    api.post("/v1/chat/completions", json={**body, "tool_choice": "none"})
    assert fe.sampling[-1].grammar is None
    turns = [
        {"role": "user", "content": "add 1 and 2"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "g", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    r = api.post("/v1/chat/completions", json={**body, "messages": turns})
    assert r.status_code == 200, r.text


def test_shaped_requests_are_counted_on_metrics(api):
    """Served requests by the output they asked for (a refused one is not counted)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "integer"}}}
    api.post("/v1/completions", json={**COMPLETION, "response_format": fmt})
    api.post("/v1/chat/completions", json={**CHAT, "response_format": {"type": "json_object"}})
    named = {"type": "function", "function": {"name": "g"}}
    api.post("/v1/chat/completions", json={**CHAT, "tools": TWO_TOOLS, "tool_choice": named})
    api.post("/v1/chat/completions", json={**CHAT, "tools": TWO_TOOLS})
    bad = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "nonsense"}}}
    assert (
        api.post("/v1/completions", json={**COMPLETION, "response_format": bad}).status_code == 400
    )
    text = api.get("/metrics").text
    for kind, n in [("json_schema", 1), ("json_object", 1), ("tools_named", 1), ("tools_auto", 1)]:
        assert f'pddflow_shaped_requests_total{{kind="{kind}"}} {n}.0' in text, text
    assert 'pddflow_shaped_requests_total{kind="tools_required"} 0.0' in text
    assert "pddflow_tool_call_answers_total 0.0" in text  # the fake answers no call


def test_a_refused_choice_ends_the_whole_request(api, fe):
    """n = 3 and the router refuses choice 2 while choice 1 is still waiting for its first
    token: the request is that 503, and every other choice's stream is ended (its legs
    cancelled), not left running."""
    import asyncio

    original = fe._generate

    async def refuse_third(request_id, sampling):
        if request_id.endswith("-2"):
            raise RequestRejected(503, "overloaded")
        if request_id.endswith("-1"):
            await asyncio.sleep(0.3)
        async for chunk in original(request_id, sampling):
            yield chunk

    fe._generate = refuse_third
    r = api.post("/v1/completions", json={**COMPLETION, "n": 3, "max_tokens": 50})
    assert r.status_code == 503 and "overloaded" in r.json()["error"]["message"]
    assert len(fe.ended) == 3  # every choice's stream ended


def test_a_grammar_dead_end_is_its_own_finish_reason_on_every_shape(api, fe):
    """The worker ends an output its grammar cannot continue (GRAMMAR_DEAD_END on the stream's
    last chunk, after EOS): the answer says so, streamed and not, on both endpoints, and a
    forced tool call cut short is never answered as tool_calls."""
    from pddflow.operators.grammar import GRAMMAR_DEAD_END

    async def cut_short(request_id, sampling):
        fe.sampling.append(sampling)
        yield [ord(c) for c in '<tool_call>{"name": "g", "arguments": {"a": 1']
        yield TokenChunk([0], finish_reason=GRAMMAR_DEAD_END)  # EOS, then the reason

    fe._generate = cut_short
    named = {"type": "function", "function": {"name": "g"}}
    bodies = [
        ("/v1/completions", COMPLETION),
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "tools": TWO_TOOLS, "tool_choice": named}),
    ]
    for path, body in bodies:
        got = api.post(path, json={**body, "max_tokens": 100}).json()["choices"][0]
        assert got["finish_reason"] == GRAMMAR_DEAD_END, got
        assert not got.get("message", {}).get("tool_calls"), got
        r = api.post(path, json={**body, "max_tokens": 100, "stream": True})
        frames = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
        finishes = [f["choices"][0]["finish_reason"] for f in frames if f["choices"]]
        # streamed, what was written of the call went out as it came: the reason says it is cut
        assert finishes[-1] == GRAMMAR_DEAD_END and set(finishes[:-1]) == {None}, finishes


def test_best_of_returns_the_likeliest_candidates_per_token(api, fe):
    """best_of 3, n 2: three flights (seeded seed, seed + 1, seed + 2), each asked for its
    sampled tokens' logprobs; the two with the highest mean logprob return, best first, with
    no logprobs unless asked; usage counts every candidate."""

    async def candidates(request_id, sampling):
        fe.sampling.append(sampling)
        k = int(request_id.rsplit("-", 1)[1]) if request_id.count("-") > 1 else 0
        mean = {0: -0.9, 1: -0.2, 2: -0.5}[k]  # choice 1 the likeliest, then 2
        for i in range(sampling.max_tokens):  # varying per token, this mean
            yield TokenChunk([ord("a") + k], [TokenLogprob(mean + (0.1 if i % 2 else -0.1))])

    fe._generate = candidates
    r = api.post(
        "/v1/completions", json={**COMPLETION, "n": 2, "best_of": 3, "max_tokens": 4, "seed": 7}
    )
    assert r.status_code == 200, r.text
    got = r.json()
    assert [c["text"] for c in got["choices"]] == ["bbbb", "cccc"]
    assert [c["index"] for c in got["choices"]] == [0, 1]
    assert all(c["logprobs"] is None for c in got["choices"])
    assert got["usage"]["completion_tokens"] == 12
    assert [s.logprobs for s in fe.sampling] == [0, 0, 0]
    assert [s.seed for s in fe.sampling] == [7, 8, 9]
    asked = api.post(
        "/v1/completions",
        json={**COMPLETION, "n": 1, "best_of": 3, "max_tokens": 4, "logprobs": 2, "seed": 1},
    ).json()["choices"]
    assert [c["text"] for c in asked] == ["bbbb"] and len(asked[0]["logprobs"]["tokens"]) == 4
