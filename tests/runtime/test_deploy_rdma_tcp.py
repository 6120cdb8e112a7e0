"""End to end: `pddflow deploy` of graphs/pdd.yaml with its rdma_tensor edge set to `transport:
tcp` (the network path, here on one host): the relay's KV comes over TCP, /health says so, and
the relay path's greedy tokens equal the colocated reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess, post_json
from pddflow.testing.chaos import greedy_reference

pytestmark = pytest.mark.slow  # starts a deployment: worker processes

ROOT = Path(__file__).resolve().parents[2]
EDGE = "{from: prefill.kv,    to: relay.kv,     channel: rdma_tensor}"


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    assert EDGE in text
    graph = tmp_path_factory.mktemp("graph") / "pdd_tcp.yaml"
    graph.write_text(text.replace(EDGE, EDGE[:-1] + ", params: {transport: tcp}}"))
    d = DeployProcess(graph, tmp_path_factory.mktemp("run"))
    yield d
    d.stop()
    assert d.leftover_children() == []


def test_relay_kv_goes_over_tcp_and_gives_the_reference_tokens(dep):
    h = dep.health()
    assert h["channels"]["prefill.kv->relay.kv"] == "tcp (same host, checksummed)"
    relay = json.loads((dep.run_dir / "wiring.json").read_text())["workers"]["relay/0"]
    assert relay["kv_rdma"] == "" and relay["kv_rdma_net"].startswith("tcp:127.0.0.1:")
    reference = greedy_reference()
    for handoff, prompt in (("one_shot", "KV over TCP to the relay"), ("catch_up", "Hello!")):
        code, out = post_json(
            f"{dep.base}/v1/completions",
            {
                "model": "pdd",
                "prompt": prompt,
                "max_tokens": 16,
                "temperature": 0,
                "return_token_ids": True,
                "variant": "p_rld_md",
                "handoff": handoff,
            },
            timeout=120,
        )
        assert code == 200, out
        assert out["choices"][0]["token_ids"] == reference(prompt, 16)
