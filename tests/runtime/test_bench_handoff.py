"""`pddflow bench handoff`: its JSON, the byte ratio of the two handoffs (sizes, not timings) and
its refusals of bad input. No test asserts a timing."""

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pddflow.bench.handoff import (
    HandoffBenchError,
    HandoffOptions,
    check_options,
    handoff_edges,
    summarize,
)
from pddflow.bench.handoff_paths import Measured
from pddflow.cli import app
from pddflow.graph import check_file
from pddflow.graph.shipped import resolve_graph

runner = CliRunner()
KEYS = {"bytes", "mean_ms", "p99_ms", "max_ms", "std_ms"}


def run(*args: str):
    res = runner.invoke(app, ["bench", "handoff", *args])
    assert "Traceback" not in (res.output or ""), res.output
    return res


def pdd_plan():
    return check_file(str(resolve_graph("pdd"))).plan


@pytest.fixture
def quick_link_graph(tmp_path: Path) -> Path:
    """pdd with a short, steady link, so a few real handoffs take well under a second each."""
    text = resolve_graph("pdd").read_text()
    old = (
        "A-B: {gbps: 100, rtt_ms: 30, stream_gbps: 2.5,\n"
        "        jitter: {dist: lognormal, p50_ms: 50, p99_ms: 2000}}"
    )
    assert old in text
    path = tmp_path / "pdd_quick.yaml"
    path.write_text(
        text.replace(
            old, "A-B: {gbps: 100, rtt_ms: 2, jitter: {dist: constant, p50_ms: 1, p99_ms: 1}}"
        )
    )
    return path


def test_json_has_both_paths_and_token_ids_are_a_hundredth_of_the_kv(quick_link_graph):
    res = run(str(quick_link_graph), "--json", "--rounds", "2", "--context", "64")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert KEYS <= set(out["token_ids"]) and KEYS <= set(out["kv"])
    assert out["tokens"] == 100 and out["rounds"] == 2 and out["graph"] == "pdd"
    tok, kv = out["token_ids"], out["kv"]
    # sizes are deterministic: 100 IDs as protobuf varints vs 7 blocks of tiny-llama's fp32 KV
    assert kv["payload_bytes"] == 7 * 16 * out["kv_bytes_per_token"]
    assert kv["bytes"] >= kv["payload_bytes"]  # what crossed the link includes the framing
    assert 0 < tok["payload_bytes"] <= tok["bytes"]
    assert tok["bytes"] <= kv["bytes"] / 100
    assert out["targets"]["token_ids bytes <= 1/100 of kv"] is True
    assert out["production"] == {"arch": "llama-3-70b", "kv_bytes": 100 * 320 * 1024}


def test_graph_without_token_ids_edge_is_refused():
    res = run("cross_dc_pd", "--rounds", "1")
    assert res.exit_code == 2
    assert "no token_ids edge" in res.output


def test_handoff_inside_one_cluster_is_refused():
    plan = pdd_plan()
    channels = tuple(
        dataclasses.replace(c, cross_cluster=False, link=None) if c.kind == "token_ids" else c
        for c in plan.channels
    )
    with pytest.raises(HandoffBenchError, match="stays inside cluster A"):
        handoff_edges(dataclasses.replace(plan, channels=channels))


def test_the_handoff_edge_and_its_link_are_found():
    edges = handoff_edges(pdd_plan())
    assert edges.token_ids.id == "relay.handoff->main.handoff"
    assert edges.link.name == "A-B" and edges.link.jitter.p99_ms == 2000
    assert edges.kv is not None and edges.kv.params["streams"] == 4


@pytest.mark.parametrize(
    "args, message",
    [
        (["--context", "1000"], "multiple of the block size 16"),
        (["--main-clock", "sundial"], "--main-clock must be one of cpu, wall"),
        (["--threads", "2"], "give --threads 1"),
        (["--rounds", "0"], "--rounds"),
        (["--tokens", "-3"], "--tokens"),
        (["no_such_graph"], "no such file"),
    ],
)
def test_bad_input_is_a_clear_error(args, message):
    res = run(*args)
    assert res.exit_code == 2
    assert message in res.output


def test_model_positions_are_checked_before_any_handoff():
    with pytest.raises(HandoffBenchError, match="multiple of the block size"):
        check_options(HandoffOptions(context=8), 16)
    res = run("--context", "16384", "--rounds", "1")
    assert res.exit_code == 2
    assert "positions" in res.output


def test_summary_figures():
    def m(link_ms: float, main_ms: float, main_cpu_ms: float) -> Measured:
        return Measured((link_ms + main_ms) / 1e3, 300, 100, 200, main_ms / 1e3, main_cpu_ms / 1e3)

    ms = [m(10, 100, 50), m(20, 100, 50), m(30, 400, 50)]
    cpu = summarize(ms, "cpu")
    assert cpu["bytes"] == 300 and cpu["payload_bytes"] == 200 and cpu["ack_bytes"] == 100
    assert cpu["mean_ms"] == pytest.approx(70) and cpu["max_ms"] == pytest.approx(80)
    assert cpu["std_ms"] == pytest.approx(10)
    assert cpu["p99_ms"] == pytest.approx(79.8)
    assert cpu["link_mean_ms"] == pytest.approx(20) and cpu["main_std_ms"] == 0
    wall = summarize(ms, "wall")
    assert wall["mean_ms"] == pytest.approx(220) and wall["max_ms"] == pytest.approx(430)
    assert wall["wall_mean_ms"] == cpu["wall_mean_ms"] == pytest.approx(220)
