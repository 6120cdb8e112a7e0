"""The planner on a deployment (docs/runtime.md, The planner): graphs/pdd.yaml with main wired
for 2 instances, a batch of 2 and `deploy --planner`, on the modeled engine (each replica takes
its devices' modeled time, so one replica's capacity is what the device model says, not what two
shared cores allow; real-engine scaling is test_deploy_elastic.py's). Load on main grows it to 2
from what its workers measured; once the load is gone it shrinks back to 1 after
scale_down_after_s. Every answer, those on the instance drained among them, is the colocated
reference's; /health and /metrics show the decisions with their reasons."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess, post_json

pytestmark = pytest.mark.slow  # a deployment: worker processes

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [f"Request {i} keeps the main pool busy for a while." for i in range(4)]
TOKENS = 80


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planner")
    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    replicas = "replicas: {prefill: 1, relay: 1, main: 1}"
    main = "params: {radix_cache: true}}"
    assert replicas in text and main in text
    text = text.replace(replicas, replicas + "\n  max_replicas: {main: 2}")
    text = text.replace(main, "params: {radix_cache: true, max_batch: 2}}")
    text += "\nautoscale: {interval_s: 1, scale_down_after_s: 2}\n"
    graph = tmp / "pdd.yaml"
    graph.write_text(text)
    d = DeployProcess(graph, tmp / "run", "--planner", "--engine", "modeled")
    yield d
    d.stop()
    assert d.leftover_children() == []


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    from pddflow.testing.chaos import GreedyReference

    return GreedyReference(engine="modeled").many(PROMPTS, TOKENS)


def _complete(dep, prompt: str) -> list[int]:
    body = {
        "model": "pdd",
        "prompt": prompt,
        "max_tokens": TOKENS,
        "temperature": 0,
        "return_token_ids": True,
        "variant": "p_md",  # straight to main
    }
    code, out = post_json(f"{dep.base}/v1/completions", body, timeout=120)
    assert code == 200, out
    return out["choices"][0]["token_ids"]


def _main_timeline(dep) -> list[int]:
    return [n for _, n in dep.health()["planner"]["timeline"]["main"]]


def test_the_planner_grows_main_under_load_and_shrinks_it_after(dep, reference):
    planner = dep.health()["planner"]
    assert planner["bounds"] == {"prefill": [1, 1], "relay": [1, 1], "main": [1, 2]}
    answers: list[tuple[str, list[int]]] = []
    deadline = time.monotonic() + 90
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        while 2 not in _main_timeline(dep):  # load until the planner has grown main
            assert time.monotonic() < deadline, dep.health()["planner"]
            answers += zip(PROMPTS, pool.map(lambda p: _complete(dep, p), PROMPTS), strict=True)
    while _main_timeline(dep)[-1] != 1:  # idle: back to one after scale_down_after_s
        assert time.monotonic() < deadline + 60, dep.health()["planner"]["last"]["main"]
        time.sleep(0.5)
    assert all(out == reference[p] for p, out in answers)
    timeline = _main_timeline(dep)
    assert timeline[0] == 1 and timeline[-1] == 1 and max(timeline) == 2
    planner = dep.health()["planner"]
    assert planner["direction_changes"]["main"] == 1
    changes = [c for c in planner["changes"] if c["operator"] == "main"]
    assert [(c["current"], c["target"]) for c in changes] == [(1, 2), (2, 1)]
    assert changes[0]["reason"].startswith("up 1->2") and "seqs over 1 x" in changes[0]["reason"]
    assert changes[1]["reason"].startswith("down 2->1")
    assert dep.metric("pddflow_planner_decisions_total", operator="main", direction="up") == 1
    assert dep.metric("pddflow_planner_target_replicas", operator="main") == 1
    assert dep.health()["pools"]["main"]["instances"] == {"main/0": "up", "main/1": "parked"}
    # after all that, main still answers as the reference does
    assert _complete(dep, PROMPTS[0]) == reference[PROMPTS[0]]
