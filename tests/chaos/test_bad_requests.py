"""A corpus of bad requests (types, ranges, sizes, encodings, nesting) against a live deployment:
none gets a 5xx, and the deployment still serves."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.slow

DEEP = json.loads("[" * 200 + "]" * 200)
COMPLETION_BODIES = [
    {},
    {"model": 1, "prompt": "x"},
    {"model": "pdd"},
    {"model": "pdd", "prompt": {}},
    {"model": "pdd", "prompt": [[1, 2]]},
    {"model": "pdd", "prompt": [-1]},
    {"model": "pdd", "prompt": [2**70]},
    {"model": "pdd", "prompt": ["a", 1]},
    {"model": "pdd", "prompt": DEEP},
    {"model": "pdd", "prompt": "x", "max_tokens": "5"},
    {"model": "pdd", "prompt": "x", "max_tokens": -1},
    {"model": "pdd", "prompt": "x", "max_tokens": 2**70},
    {"model": "pdd", "prompt": "x", "max_tokens": 1e30},
    {"model": "pdd", "prompt": "x", "max_tokens": 10**9},
    {"model": "pdd", "prompt": "x", "temperature": "hot"},
    {"model": "pdd", "prompt": "x", "temperature": -1},
    {"model": "pdd", "prompt": "x", "top_p": 2},
    {"model": "pdd", "prompt": "x", "seed": -1},
    {"model": "pdd", "prompt": "x", "seed": 2**64},
    {"model": "pdd", "prompt": "x", "seed": True},
    {"model": "pdd", "prompt": "x", "stop": 5},
    {"model": "pdd", "prompt": "x", "stop": [[1]]},
    {"model": "pdd", "prompt": "x", "timeout_s": -3},
    {"model": "pdd", "prompt": "x", "variant": 7},
    {"model": "pdd", "prompt": "x", "handoff": "sideways"},
    {"model": "pdd", "prompt": "\ud800 lone surrogate"},
    {"model": "pdd", "prompt": "x" * 300_000},
    {"model": "x" * 100_000, "prompt": "x"},
    {"model": "pdd", "prompt": "x", "stream": "yes"},
    {"model": "pdd", "prompt": "x", "stop": ""},
    {"model": "pdd", "prompt": "x", "echo": True, "logprobs": 5, "best_of": 3},
    {"model": "pdd", "prompt": "x", "stream_options": {"include_usage": True}},
    {"model": "pdd", "prompt": "x", "y" * 100_000: 1},
]
CHAT_BODIES = [
    {"model": "pdd", "messages": []},
    {"model": "pdd", "messages": "hi"},
    {"model": "pdd", "messages": [{"role": "user"}]},
    {"model": "pdd", "messages": [{"role": "wizard", "content": "hi"}]},
    {"model": "pdd", "messages": [{"role": "user", "content": 5}]},
    {"model": "pdd", "messages": [{"role": "user", "content": "\udfff"}]},
    {"model": "pdd", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -2},
    {"model": "pdd", "messages": [{"role": "user", "content": "hi"}], "tools": [{}]},
    {"model": "pdd", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
    {"model": "pdd", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
]
RAW_BODIES = [b"", b"not json", b"[1, 2]", b'{"model": "pdd", "prompt": "\xff\xfe"}', b"{" * 10_000]


def send(dep, path: str, data: bytes, method: str = "POST") -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"{dep.base}{path}", data, {"Content-Type": "application/json"}, method=method
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _openai_error(body: bytes) -> bool:
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return len(body) < 2000 and set(err) == {"message", "type", "param", "code"}


def test_bad_requests_get_no_5xx(pdd, reference):
    cases = [("/v1/completions", json.dumps(b).encode()) for b in COMPLETION_BODIES]
    cases += [("/v1/chat/completions", json.dumps(b).encode()) for b in CHAT_BODIES]
    cases += [("/v1/completions", raw) for raw in RAW_BODIES]
    bad = []
    for path, data in cases:
        code, body = send(pdd, path, data)
        # no 5xx and no crash; every refusal a 4xx in the OpenAI error shape, of bounded size
        if not (400 <= code < 500 and _openai_error(body)):
            bad.append((code, data[:80], body[:200]))
    for path, method in (("/v1/completions", "GET"), ("/v1/nowhere", "POST"), ("/x" * 5000, "GET")):
        code, body = send(pdd, path, None, method=method)
        if not (400 <= code < 500 and _openai_error(body)):
            bad.append((code, f"{method} {path[:40]}".encode(), body[:200]))
    assert bad == []
    code, body = send(
        pdd,
        "/v1/completions",
        json.dumps(
            {
                "model": "pdd",
                "prompt": "still fine",
                "max_tokens": 6,
                "temperature": 0,
                "return_token_ids": True,
            }
        ).encode(),
    )
    assert code == 200 and json.loads(body)["choices"][0]["token_ids"] == reference("still fine", 6)
