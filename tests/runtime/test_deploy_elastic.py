"""Live scaling of a pool on a real deployment (docs/runtime.md, Live scaling): graphs/pdd.yaml
with `local.max_replicas: {main: 2}` starts one main and wires two. POST /admin/pools/main scales
main to 2 (the new instance starts and joins routing) and back to 1 while a request streams on the
instance being drained: it finishes with the colocated reference's tokens, and the instance's
process is gone. Bounds, unknown pools and a missing admin key are refused."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess, get_json, post_json

pytestmark = pytest.mark.slow  # a deployment: worker processes

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["An elastic pool grows.", "And shrinks again, while a request still streams."]


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("elastic")
    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    replicas = "replicas: {prefill: 1, relay: 1, main: 1}"
    assert replicas in text
    text = text.replace(replicas, replicas + "\n  max_replicas: {main: 2}")
    graph = tmp / "pdd.yaml"
    graph.write_text(text)
    d = DeployProcess(graph, tmp / "run")
    yield d
    d.stop()
    assert d.leftover_children() == []


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    from pddflow.core.payloads import SamplingParams
    from pddflow.operators.engine import Engine

    eng = Engine.from_spec("builtin:tiny-llama")
    eos = tuple(eng.tokenizer.eos_token_ids)
    return {
        p: eng.generate([eng.tokenizer.encode(p)], SamplingParams(60, stop_token_ids=eos))[
            0
        ].output_ids
        for p in PROMPTS
    }


def _scale(dep, operator: str, replicas, key: str | None = "admin") -> tuple[int, dict]:
    key = dep.admin_key if key == "admin" else key
    url = f"{dep.base}/admin/pools/{operator}"
    return post_json(url, {"replicas": replicas}, timeout=120, key=key)


def _complete(dep, prompt: str, variant: str, max_tokens: int, served: list | None = None):
    """The greedy tokens; `served` gets the instances that streamed them (the timeline's)."""
    body = {
        "model": "pdd",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
        "variant": variant,
    }
    code, out = post_json(f"{dep.base}/v1/completions", body, timeout=120)
    assert code == 200, out
    if served is not None:
        _, timeline = get_json(f"{dep.base}/v1/requests/{out['id']}/timeline")
        served += [e["instance"] for e in timeline["events"] if "instance" in e]
    return out["choices"][0]["token_ids"]


def test_a_pool_grows_and_shrinks_without_losing_a_request(dep, reference):
    pool = dep.health()["pools"]["main"]
    assert pool == {"serving": 1, "max": 2, "instances": {"main/0": "up", "main/1": "parked"}}
    assert dep.metric("pddflow_pool_instances", operator="main", state="parked") == 1
    before = set(dep.health()["workers"])

    code, out = _scale(dep, "main", 2)
    assert code == 200, out
    assert out == {"serving": 2, "max": 2, "instances": {"main/0": "up", "main/1": "up"}}
    assert dep.worker_pid("main/1") > 0 and set(dep.health()["workers"]) == before

    # main/0 busy with a long request: the scheduler sends the next one to main/1 (least load)
    long = threading.Thread(target=_complete, args=(dep, PROMPTS[0], "p_md", 60))
    long.start()
    deadline = time.monotonic() + 30
    while dep.health()["workers"]["main/0"].get("running", 0) < 1:  # its status says so
        assert time.monotonic() < deadline, dep.health()
        time.sleep(0.05)
    served: list[str] = []
    got = _complete(dep, PROMPTS[1], "p_md", 60, served)
    long.join()
    assert got == reference[PROMPTS[1]]
    assert "main/1" in served  # the new instance took it: the least loaded

    # shrink while a request streams: main/1 holds the prompt's blocks, so the scheduler sends
    # it there again, and draining main/1 waits for it (or, past the drain, it moves on)
    results: list[list[int]] = []
    on: list[str] = []
    streaming = threading.Thread(
        target=lambda: results.append(_complete(dep, PROMPTS[1], "p_rld_md", 60, on))
    )
    streaming.start()
    deadline = time.monotonic() + 30
    while dep.health()["workers"]["main/1"].get("legs", 0) < 1:  # main/1 holds it now
        assert time.monotonic() < deadline, dep.health()
        time.sleep(0.02)
    code, out = _scale(dep, "main", 1)
    streaming.join()
    assert code == 200, out
    assert out == {"serving": 1, "max": 2, "instances": {"main/0": "up", "main/1": "parked"}}
    assert results == [reference[PROMPTS[1]]]
    assert "main/1" in on  # it was on the instance drained, and finished there
    assert _complete(dep, PROMPTS[0], "p_md", 60) == reference[PROMPTS[0]]
    health = dep.health()
    assert health["status"] == "ready" and health["workers"]["main/1"]["state"] == "parked"


@pytest.mark.parametrize(
    "operator, replicas, key, status",
    [
        ("main", 3, "admin", 400),  # over max_replicas
        ("main", 0, "admin", 400),  # a pool keeps one
        ("nowhere", 1, "admin", 404),
        ("main", 2, None, 401),
    ],
)
def test_pool_changes_outside_the_bounds_are_refused(dep, operator, replicas, key, status):
    code, out = _scale(dep, operator, replicas, key)
    assert code == status, out
    assert dep.health()["pools"]["main"]["serving"] == 1
