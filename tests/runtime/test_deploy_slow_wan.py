"""PDD over a slow WAN (0.05 Gbps), end to end: the relay streams while main's KV crosses; a second
turn sends only what main's radix cache lacks; singular traffic (the graph's `local` profile
scales the thresholds to the built-in model, the expected output comes from max_tokens) is
finished on the relay, its WAN leg never sent."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess
from pddflow.testing.chaos import greedy_reference

pytestmark = pytest.mark.slow  # starts a deployment: worker processes

openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [(7 * i + 3) % 250 + 5 for i in range(1100)]  # byte-level vocabulary of 259


@pytest.fixture(scope="module")
def singular(tmp_path_factory):
    d = tmp_path_factory.mktemp("singular")
    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    # every qualifying request may be singular here (the shipped share cap is 4%)
    graph = d / "pdd_singular.yaml"
    graph.write_text(
        text.replace(
            "singular_max_output_tokens: 32}",
            "singular_max_output_tokens: 32, singular_max_share: 1.0}",
        )
    )
    assert graph.read_text() != text
    # 1100 tokens x 32 KiB over 0.05 Gbps: 5.8 s, over TTFT 5 s
    dep = DeployProcess(graph, d / "run", "--wan-gbps", "0.05")
    yield dep
    dep.stop()
    assert dep.leftover_children() == []


def reference_ids(max_tokens: int, prompt: list[int] = PROMPT) -> tuple[list[int], str]:
    from pddflow.core.payloads import SamplingParams

    eng = greedy_reference().engine
    sampling = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, stop_token_ids=tuple(eng.tokenizer.eos_token_ids)
    )
    ids = eng.generate([prompt], sampling)[0].output_ids
    return ids, eng.tokenizer.decode(ids)


def timeline(dep: DeployProcess, rid: str) -> dict:
    url = f"{dep.base}/v1/requests/{rid}/timeline"
    return json.loads(urllib.request.urlopen(url, timeout=5).read())


def complete(
    dep: DeployProcess, max_tokens: int, prompt: list[int] = PROMPT, **extra: str
) -> tuple[str, dict]:
    client = openai.OpenAI(base_url=f"{dep.base}/v1", api_key="unused", timeout=90, max_retries=0)
    r = client.completions.with_raw_response.create(
        model="pdd",
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        extra_body=extra or None,
    )
    tl = timeline(dep, r.headers["x-request-id"])
    return r.parse().choices[0].text, tl


def test_a_short_answer_to_a_long_prompt_finishes_on_the_relay(singular):
    text, tl = complete(singular, 16)
    assert text == reference_ids(16)[1]  # greedy: exactly the colocated reference's tokens
    arrival = tl["events"][0]
    assert arrival["variant"] == "p_rld_md" and arrival["reason"].startswith("singular"), arrival
    assert tl["tokens_by_operator"] == {"relay": tl["output_tokens"]}
    # the WAN leg was never sent: main had neither the request nor any of its KV
    touched = [e for e in tl["events"] if "main/0" in (e.get("peer"), e.get("instance"))]
    assert touched == []
    assert singular.wait_idle()["workers"]["main/0"]["legs"] == 0


def event(tl: dict, name: str, instance: str) -> dict:
    return next(e for e in tl["events"] if e["event"] == name and e.get("instance") == instance)


def test_the_relay_streams_before_mains_kv_lands(singular):
    _, tl = complete(singular, 48, PROMPT[:200], variant="p_rld_md")
    rid = tl["request_id"]
    deadline = time.monotonic() + 30
    # 200 x 32 KiB at 0.05 Gbps: about a second; the relay may have finished all 48 tokens by
    # then, and main's landing joins the ended request's timeline later
    while not any(
        e["event"] == "kv_landed" and e.get("instance") == "main/0" for e in tl["events"]
    ):
        assert time.monotonic() < deadline, tl["events"]
        time.sleep(0.2)
        tl = timeline(singular, rid)
    first = event(tl, "first_token", "relay/0")
    landed = event(tl, "kv_landed", "main/0")
    assert first["t_ms"] < landed["t_ms"], tl["events"]
    assert tl["tokens_by_operator"]["relay"] >= 1


def test_a_second_turn_sends_what_mains_cache_lacks(singular):
    turn1 = PROMPT[300:500]
    text, _ = complete(singular, 48, turn1, variant="p_md")
    ids, expected = reference_ids(48, turn1)
    assert text == expected
    singular.wait_idle()
    turn2 = turn1 + ids + PROMPT[600:624]  # the answer and 24 new user tokens
    _, tl2 = complete(singular, 8, turn2)
    wan = next(e for e in tl2["events"] if e["event"] == "kv_send" and e.get("peer") == "main/0")
    full = wan["bytes"] + wan["saved_bytes"]
    assert full > 0 and wan["bytes"] <= 0.2 * full, wan
