"""`pddflow deploy graphs/sim/pdd_88.yaml --engine modeled --profile production`: the 88-GPU
deployment's 22 instances on this machine, each a worker process without torch taking the device
model's time; the openai client's answers equal the modeled colocated reference on every route."""

from __future__ import annotations

from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess

pytestmark = pytest.mark.slow  # starts a deployment: 22 worker processes

ROOT = Path(__file__).resolve().parents[2]
openai = pytest.importorskip("openai")

PROMPTS = ["The relay decodes while the KV crosses the WAN.", "Twenty-two instances, two cores."]
ROUTES = [("p_md", None), ("p_rld_md", "one_shot"), ("p_rld_md", "catch_up")]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    graph = ROOT / "graphs" / "sim" / "pdd_88.yaml"
    dep = DeployProcess(
        graph,
        tmp_path_factory.mktemp("pdd88-run"),
        "--engine",
        "modeled",
        "--profile",
        "production",
        "--cpu-pinning",
        "none",
    )
    yield dep
    out = dep.stop()
    assert dep.leftover_children() == [], out


def test_every_instance_of_the_88_gpu_graph_serves_the_reference(fleet):
    from pddflow.testing.chaos import GreedyReference

    health = fleet.health()
    workers = health["workers"]
    assert len(workers) == 22 and all(w["ready"] for w in workers.values())
    # one process a replica, whatever its devices, and no torch in it
    for w in workers.values():
        maps = Path(f"/proc/{w['pid']}/maps").read_text()
        assert len(w["ranks"]) == 1 and "libtorch" not in maps
    want = GreedyReference("builtin:tiny-llama", engine="modeled").many(PROMPTS, MAX_TOKENS)
    client = openai.OpenAI(base_url=f"{fleet.base}/v1", api_key="unused", max_retries=0)
    for prompt in PROMPTS:
        for variant, handoff in ROUTES:
            r = client.completions.create(
                model="pdd_88",
                prompt=prompt,
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                extra_body={"return_token_ids": True, "variant": variant, "handoff": handoff},
            )
            assert r.choices[0].model_extra["token_ids"] == want[prompt], (variant, handoff)
            assert r.choices[0].finish_reason == "length"
    served = fleet.metric("pddflow_requests_total", variant="p_rld_md", outcome="ok")
    assert served >= 2 * len(PROMPTS)
