"""The baselines deploy with the same command and emit the colocated reference's tokens; a PDD
graph whose cross-datacenter edges ask for TLS deploys encrypted and still does."""

from __future__ import annotations

from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess, get_json, post_json
from pddflow.testing.chaos import greedy_reference

pytestmark = pytest.mark.slow  # starts a deployment: worker processes

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Baselines deploy the same way."


@pytest.fixture(scope="module")
def reference() -> list[int]:
    from pddflow.core.payloads import SamplingParams

    eng = greedy_reference().engine
    return eng.generate(
        [eng.tokenizer.encode(PROMPT)],
        SamplingParams(
            max_tokens=12, temperature=0.0, stop_token_ids=tuple(eng.tokenizer.eos_token_ids)
        ),
    )[0].output_ids


def _tls_graph(tmp: Path) -> Path:
    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    text = text.replace(
        "channel: wan_flight, params: {streams: 4}",
        "channel: wan_flight, params: {streams: 4, tls: true}",
    )
    text = text.replace(
        "to: main.handoff, channel: token_ids}",
        "to: main.handoff, channel: token_ids, params: {tls: true}}",
    )
    assert text.count("tls: true") == 2
    path = tmp / "pdd_tls.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("graph", ["cross_dc_pd.yaml", "same_dc_pd.yaml", "colocated.yaml", "tls"])
def test_graph_deploys_and_matches_reference(graph, reference, tmp_path):
    path = _tls_graph(tmp_path) if graph == "tls" else ROOT / "graphs" / graph
    dep = DeployProcess(path, tmp_path / "run")
    try:
        model = get_json(f"{dep.base}/v1/models")[1]["data"][0]["id"]
        body = {
            "model": model,
            "prompt": PROMPT,
            "max_tokens": 12,
            "temperature": 0,
            "return_token_ids": True,
        }
        if graph == "tls":
            body |= {"variant": "p_rld_md", "handoff": "one_shot"}
        code, out = post_json(f"{dep.base}/v1/completions", body, timeout=60)
        assert code == 200, out
        assert out["choices"][0]["token_ids"] == reference
    finally:
        dep.stop()
    assert dep.leftover_children() == []
