"""The strict OpenAI API on a real deployment of graphs/pdd.yaml, with the official `openai` client:
every endpoint, the honoured fields, the refused ones (400 naming the field), usage with cached
tokens, stream_options.include_usage, the chat default of max_tokens, errors in the OpenAI shape
and the API and admin keys (docs/openai-api.md). test_openai_api_fast.py has the schema's cases."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess, get_json, post_json

pytestmark = pytest.mark.slow  # starts a deployment: worker processes

openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
KEY = "test-api-key"


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    d = DeployProcess(ROOT / "graphs" / "pdd.yaml", tmp_path_factory.mktemp("api-run"), api_key=KEY)
    yield d
    out = d.stop()
    assert d.leftover_children() == [], out


@pytest.fixture(scope="module")
def client(dep):
    return openai.OpenAI(base_url=f"{dep.base}/v1", api_key=KEY, timeout=120, max_retries=0)


def _raw(dep, path: str, data: bytes | None, method: str = "POST", key: str | None = KEY):
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"{dep.base}{path}", data, headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_models_and_honoured_completion_fields(client):
    assert [m.id for m in client.models.list()] == ["pdd"]
    assert client.models.retrieve("pdd").id == "pdd"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")
    kw = dict(model="pdd", prompt="Seeds repeat:", max_tokens=6, temperature=0.9, top_p=0.9)
    ids = {"return_token_ids": True}
    a = client.completions.create(**kw, seed=11, user="someone", n=1, extra_body=ids)
    b = client.completions.create(**kw, seed=11, extra_body=ids)
    # the seed is honoured
    assert a.choices[0].model_extra["token_ids"] == b.choices[0].model_extra["token_ids"]
    assert a.choices[0].text == b.choices[0].text
    assert a.usage.completion_tokens == len(a.choices[0].model_extra["token_ids"])
    assert a.usage.total_tokens == a.usage.prompt_tokens + a.usage.completion_tokens
    assert a.usage.prompt_tokens_details.cached_tokens >= 0
    # best_of: the candidate of the n=3 with the same seed whose tokens are likeliest, per token
    cands = client.completions.create(**kw, seed=11, n=3, logprobs=0, extra_body=ids)
    best = max(cands.choices, key=lambda c: sum(c.logprobs.token_logprobs) / len(c.logprobs.tokens))
    one = client.completions.create(**kw, seed=11, best_of=3, extra_body=ids)
    assert [c.text for c in one.choices] == [best.text] and one.choices[0].logprobs is None
    assert one.usage.completion_tokens == cands.usage.completion_tokens  # every candidate's
    # a stop string ends the text before it
    g = client.completions.create(model="pdd", prompt="Stop here:", max_tokens=12, temperature=0)
    text = g.choices[0].text
    if len(text) > 3:
        s = client.completions.create(
            model="pdd", prompt="Stop here:", max_tokens=12, temperature=0, stop=[text[2:4]]
        )
        assert s.choices[0].text == text[: text.find(text[2:4])]
        assert s.choices[0].finish_reason == "stop"


def test_cached_tokens_reported(client):
    prompt = "A prompt long enough to fill several KV blocks of the prefix cache. " * 8
    kw = dict(model="pdd", prompt=prompt, max_tokens=4, temperature=0)
    extra = {"variant": "p_rld_md", "handoff": "one_shot"}
    first = client.completions.create(**kw, extra_body=extra)
    again = client.completions.create(**kw, extra_body=extra)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < again.usage.prompt_tokens, (first.usage, again.usage)


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_stream_include_usage(client, chat):
    kw = dict(
        model="pdd",
        max_tokens=5,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    if chat:
        chunks = list(
            client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **kw)
        )
    else:
        chunks = list(client.completions.create(prompt="Usage at the end", **kw))
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens >= 1
    assert last.usage.prompt_tokens_details.cached_tokens >= 0
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_max_tokens_defaults_to_the_context(client):
    stream = client.chat.completions.create(
        model="pdd",
        messages=[{"role": "user", "content": "Talk for a long time."}],
        temperature=0,
        stream=True,
        extra_body={"return_token_ids": True},
    )
    got, finish = 0, None
    for chunk in stream:
        got += len(chunk.choices[0].model_extra.get("token_ids") or [])
        finish = chunk.choices[0].finish_reason
        if got > 20 or finish:
            break
    stream.close()
    # not OpenAI's completions default of 16: generation goes on (or the model ended it)
    assert got > 16 or finish == "stop", (got, finish)


def test_chat_honoured_fields(client):
    r = client.chat.completions.create(
        model="pdd",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "u"},
        ],
        max_completion_tokens=3,
        temperature=0,
        seed=3,
        n=1,
        user="someone",
        tools=[],
        tool_choice="none",
        response_format={"type": "text"},
        presence_penalty=0,
        frequency_penalty=0,
        logprobs=False,
        store=False,
    )
    assert r.usage.completion_tokens <= 3 and r.choices[0].message.role == "assistant"


@pytest.mark.parametrize(
    "kind, kw, param",
    [
        ("completions", {"echo": True}, "echo"),
        ("completions", {"best_of": 2, "n": 3}, "best_of"),
        ("completions", {"n": 17}, "n"),
        ("completions", {"logprobs": 6}, "logprobs"),
        ("completions", {"suffix": "end"}, "suffix"),
        ("completions", {"frequency_penalty": 2.5}, "frequency_penalty"),
        ("completions", {"presence_penalty": -2.1}, "presence_penalty"),
        ("completions", {"logit_bias": {"5": 10}}, "logit_bias"),
        ("completions", {"stop": ""}, "stop"),
        ("completions", {"extra_body": {"top_k": -2}}, "top_k"),
        ("completions", {"extra_body": {"min_p": 1.5}}, "min_p"),
        ("completions", {"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"top_logprobs": 2}, "top_logprobs"),
        ("chat", {"response_format": {"type": "xml"}}, "response_format.type"),
        (
            "chat",
            {"tools": [{"type": "function", "function": {"name": "f g", "parameters": {}}}]},
            "tools.0.function.name",
        ),
        ("chat", {"tool_choice": "required"}, "tool_choice"),  # without tools
        ("chat", {"n": 0}, "n"),
        ("chat", {"reasoning_effort": "low"}, "reasoning_effort"),
        ("chat", {"store": True}, "store"),
    ],
)
def test_unsupported_fields_are_400_naming_them(client, kind, kw, param):
    with pytest.raises(openai.BadRequestError) as err:
        if kind == "chat":
            client.chat.completions.create(
                model="pdd", messages=[{"role": "user", "content": "x"}], max_tokens=2, **kw
            )
        else:
            client.completions.create(model="pdd", prompt="x", max_tokens=2, **kw)
    body = err.value.body
    assert body["param"] == param and body["type"] == "invalid_request_error", body


@pytest.mark.parametrize(
    "body, param",
    [
        ({"seed": True}, "seed"),
        ({"stream": "yes"}, "stream"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"temperature": "0.5"}, "temperature"),
    ],
)
def test_no_coercion(dep, body, param):
    code, out = post_json(
        f"{dep.base}/v1/completions", {"model": "pdd", "prompt": "x", **body}, key=KEY
    )
    assert code == 400 and out["error"]["param"] == param, out


def test_errors_are_openai_shaped_and_bounded(dep, client):
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    assert err.value.body["code"] == "model_not_found"
    for path, data, method, status in [
        ("/v1/completions", json.dumps({"model": "m" * 1_000_000, "prompt": "x"}), "POST", 404),
        ("/v1/completions", "{not json", "POST", 400),
        ("/v1/nowhere", "{}", "POST", 404),
        ("/v1/completions", None, "GET", 405),
    ]:
        code, body = _raw(dep, path, data.encode() if data else None, method)
        assert code == status and len(body) < 2000, (path, code, body[:200])
        assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}


def test_api_and_admin_keys(dep):
    with pytest.raises(openai.AuthenticationError) as err:
        openai.OpenAI(base_url=f"{dep.base}/v1", api_key="wrong", max_retries=0).models.list()
    assert err.value.body["code"] == "invalid_api_key"
    code, body = _raw(dep, "/v1/models", None, "GET", key=None)
    assert code == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    # /health and /metrics stay open
    assert get_json(f"{dep.base}/health")[0] == 200
    assert dep.metric("pddflow_requests_total") >= 0
    # the admin endpoint takes the admin key only (DeployProcess generated and sends it)
    cut = json.dumps({"seconds": 0.1}).encode()
    assert _raw(dep, "/admin/links/A-B/cut", cut, key=None)[0] == 401
    assert _raw(dep, "/admin/links/A-B/cut", cut, key=KEY)[0] == 401
    code, out = dep.cut_link("A-B", 0.1)
    assert code == 200 and out["link"] == "A-B"
