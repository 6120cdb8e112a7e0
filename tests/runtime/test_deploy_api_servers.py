"""`pddflow deploy --api-servers 2`: two HTTP processes on the deployment's one port, one router.
Each request's tokens go from the workers to the API process holding its connection; the answers
equal the colocated reference on every route, streamed or not, and /health, /metrics and the
timelines answer for the whole deployment from the shared port. (The chaos suite's deployment
serves with two API processes too: every fault drill holds for them.)"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from pddflow.bench.deploy_process import DeployProcess

pytestmark = pytest.mark.slow  # starts a deployment: 3 workers and 2 API processes

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["Two API processes, one router.", "The tokens skip the router on their way."]
ROUTES = [("p_md", None), ("p_rld_md", "one_shot"), ("p_rld_md", "catch_up")]
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def split():
    dep = DeployProcess(
        ROOT / "graphs" / "pdd.yaml",
        None,
        "--engine",
        "modeled",
        "--api-servers",
        "2",
        "--cpu-pinning",
        "none",
    )
    yield dep
    out = dep.stop()
    assert dep.leftover_children() == [], out


@pytest.fixture(scope="module")
def want():
    from pddflow.testing.chaos import GreedyReference

    return GreedyReference("builtin:tiny-llama", engine="modeled").many(PROMPTS, MAX_TOKENS)


def body(prompt: str, variant: str, handoff: str | None, **more) -> dict:
    return {
        "model": "pdd",
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "return_token_ids": True,
        "variant": variant,
        "handoff": handoff,
        **more,
    }


def complete(dep: DeployProcess, prompt: str, variant: str, handoff: str | None) -> dict:
    r = httpx.post(f"{dep.base}/v1/completions", json=body(prompt, variant, handoff), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(dep: DeployProcess, prompt: str, variant: str, handoff: str | None) -> list[int]:
    ids: list[int] = []
    asked = body(prompt, variant, handoff, stream=True)
    with httpx.stream("POST", f"{dep.base}/v1/completions", json=asked, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ids += json.loads(line[6:])["choices"][0].get("token_ids") or []
    return ids


def test_every_route_streams_the_reference_from_either_process(split, want):
    health = split.health()
    assert [a["name"] for a in health["api_servers"]] == ["api-0", "api-1"]
    assert all(a["alive"] for a in health["api_servers"])
    served_before = split.metric("pddflow_requests_total", variant="p_rld_md", outcome="ok")
    jobs = [(p, v, h) for p in PROMPTS for v, h in ROUTES] * 2
    with ThreadPoolExecutor(6) as pool:  # at once: the kernel hands the connections around
        answers = list(pool.map(lambda j: complete(split, *j), jobs))
        streams = list(pool.map(lambda j: streamed(split, *j), jobs))
    apis = set()
    for (prompt, variant, handoff), answer, ids in zip(jobs, answers, streams, strict=True):
        assert answer["choices"][0]["token_ids"] == want[prompt], (variant, handoff)
        assert ids == want[prompt], (variant, handoff)
        t = httpx.get(f"{split.base}/v1/requests/{answer['id']}/timeline", timeout=10).json()
        arrival = next(e for e in t["events"] if e["event"] == "arrival")
        apis.add(arrival["api"])  # the process the workers streamed it to
        assert t["output_tokens"] == MAX_TOKENS and t["finished"]
        assert "first_token" in [e["event"] for e in t["events"]]
        if variant == "p_rld_md":  # the relay's tokens, then main's once it has taken over
            assert "relay" in t["tokens_by_operator"], t
            assert set(t["tokens_by_operator"]) <= {"relay", "main"}, t
    assert apis <= {"api-0", "api-1"}
    served = split.metric("pddflow_requests_total", variant="p_rld_md", outcome="ok")
    assert served - served_before == 2 * sum(v == "p_rld_md" for _, v, _ in jobs)


def test_a_rejection_and_a_bad_request_answer_as_with_one_process(split):
    r = httpx.post(
        f"{split.base}/v1/completions",
        json={"model": "pdd", "prompt": "x", "max_tokens": 4, "variant": "nope"},
        timeout=30,
    )
    assert r.status_code == 400 and "unknown variant 'nope'" in r.json()["error"]["message"]
    r = httpx.get(f"{split.base}/v1/requests/no-such-request/timeline", timeout=30)
    assert r.status_code == 404
    assert "pddflow_requests_total" in httpx.get(f"{split.base}/metrics", timeout=30).text
