"""The metrics families vLLM dashboards chart, filled by a real deployment of graphs/pdd.yaml;
finish reasons (a stop string is a success, `stop`); the handoff latency histogram."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a deployment: worker processes

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "The relay decodes while the KV crosses the WAN."
M = {"model_name": "pdd"}

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def pdd(shipped_pdd):
    return shipped_pdd  # conftest.py: shared with the other request-only modules


@pytest.fixture(scope="module")
def client(pdd):
    return openai.OpenAI(base_url=f"{pdd.base}/v1", api_key="unused", timeout=60, max_retries=0)


def _wait_for(pdd, name: str, at_least: float, timeout_s: float = 30.0, **labels) -> float:
    deadline = time.monotonic() + timeout_s
    while True:
        v = pdd.metric(name, **labels)
        if v >= at_least or time.monotonic() > deadline:
            return v
        time.sleep(0.2)


# the counters and histogram counts the first test reads, as deltas over its requests (the
# deployment is shared: other modules' requests came before)
HISTOGRAMS = (  # one observation per request
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
)
COUNTED = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:request_prompt_tokens_sum",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
    "vllm:time_per_output_token_seconds_count",
    "vllm:request_prefill_time_seconds_count",
    "vllm:request_queue_time_seconds_count",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    *(f"{h}_count" for h in HISTOGRAMS),
)
REASONS = ("length", "stop")


def _counts(pdd) -> dict[str, float]:
    out = {name: pdd.metric(name, **M) for name in COUNTED}
    for r in REASONS:
        out[r] = pdd.metric("vllm:request_success_total", finished_reason=r, **M)
    return out


def test_vllm_families_after_requests(pdd, client):
    """Three requests' worth of every family, counted from what the deployment had served."""
    n, max_tokens = 3, 12
    pdd.wait_idle()
    before = _counts(pdd)
    outs = [
        client.completions.create(
            model="pdd", prompt=PROMPT, max_tokens=max_tokens, temperature=0, extra_body=extra
        )
        for extra in ({}, {"variant": "p_md"}, {"variant": "p_rld_md"})
    ]
    generated = sum(o.usage.completion_tokens for o in outs)
    prompt = outs[0].usage.prompt_tokens
    pdd.wait_idle()
    # every request went through prefill, which told its queue and run time and cache hit
    got = "vllm:request_prefill_time_seconds_count"
    _wait_for(pdd, got, before[got] + n, **M)
    after = _counts(pdd)
    d = {k: after[k] - before[k] for k in after}
    assert d["vllm:prompt_tokens_total"] == n * prompt
    assert d["vllm:generation_tokens_total"] == generated
    assert d["vllm:request_success_total"] == n
    assert d["length"] + d["stop"] == n
    for h in HISTOGRAMS:
        assert d[f"{h}_count"] == n, h
    assert d["vllm:request_prompt_tokens_sum"] == n * prompt
    ttft, e2e = d["vllm:time_to_first_token_seconds_sum"], d["vllm:e2e_request_latency_seconds_sum"]
    assert 0 < ttft < e2e
    assert d["vllm:inter_token_latency_seconds_count"] > 0
    assert (
        d["vllm:time_per_output_token_seconds_count"] == d["vllm:inter_token_latency_seconds_count"]
    )
    assert d[got] == n
    assert d["vllm:request_queue_time_seconds_count"] == n
    assert d["vllm:prefix_cache_queries_total"] == n * prompt
    # the same prompt again (here, or before in a module sharing the deployment): its full blocks
    # come from the cache, its last partial block never does
    assert 0 < d["vllm:prefix_cache_hits_total"] < n * prompt
    # idle now: nothing running or waiting; only prefix caches hold KV blocks
    assert pdd.metric("vllm:num_requests_running", **M) == 0
    assert pdd.metric("vllm:num_requests_waiting", **M) == 0
    usage = pdd.metric("vllm:kv_cache_usage_perc", **M)
    assert 0 < usage < 1
    assert pdd.metric("vllm:gpu_cache_usage_perc", **M) == usage


def test_stop_string_is_a_success(pdd, client):
    full = client.completions.create(
        model="pdd", prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"variant": "p_md"}
    ).choices[0]
    text = full.text
    # a stop string from the middle of the (gibberish) output, free of undecodable bytes
    at = next(
        i for i in range(2, len(text) - 2) if "\ufffd" not in text[i : i + 2] and text[i : i + 2]
    )
    stop = text[at : at + 2]
    ok_before = pdd.metric("pddflow_requests_total", outcome="ok")
    stop_before = pdd.metric("vllm:request_success_total", finished_reason="stop", **M)
    cancelled_before = pdd.metric("pddflow_requests_total", outcome="cancelled")
    for stream in (False, True):
        kw = dict(model="pdd", prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
        if stream:
            chunks = list(client.completions.create(stream=True, **kw))
            got = "".join(c.choices[0].text for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            out = client.completions.create(**kw).choices[0]
            got, reason = out.text, out.finish_reason
        assert reason == "stop"
        assert got == text[: text.find(stop)]
    pdd.wait_idle()
    assert pdd.metric("pddflow_requests_total", outcome="ok") == ok_before + 2
    assert pdd.metric("pddflow_requests_total", outcome="cancelled") == cancelled_before
    assert pdd.metric("vllm:request_success_total", finished_reason="stop", **M) == stop_before + 2


def test_handoff_latency_is_observed(pdd, client):
    before = pdd.metric("pddflow_handoff_seconds_count")
    for mode in ("one_shot", "catch_up"):
        client.completions.create(
            model="pdd",
            prompt=PROMPT + " " + mode,
            max_tokens=24,
            temperature=0,
            extra_body={"variant": "p_rld_md", "handoff": mode},
        )
    # main extends over the relay's final batch just after the request ends, or later
    assert _wait_for(pdd, "pddflow_handoff_seconds_count", before + 2) == before + 2
    for mode in ("one_shot", "catch_up"):
        n = pdd.metric("pddflow_handoff_seconds_count", mode=mode)
        assert n >= 1, mode
        assert 0 < pdd.metric("pddflow_handoff_seconds_sum", mode=mode) < 60 * n
