"""Placement on a Ray cluster, without Ray: what each instance asks for, which share a node, and
the `FILE:LINE:COL` diagnostics of a cluster that cannot hold the graph."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from pddflow.graph import load_plan
from pddflow.runtime.deploy.ray_placement import Node, diagnostics, groups, problems
from pddflow.runtime.transports import transports

ROOT = Path(__file__).resolve().parents[2]
PDD = str(ROOT / "graphs" / "pdd.yaml")


def _plan(ranks: int | None = None):
    """pdd.yaml's local plan (one rank an instance), or with `ranks` per instance."""
    from dataclasses import replace

    plan = load_plan(PDD)
    if ranks is not None:
        plan = replace(plan, local_devices=dict.fromkeys(plan.operators, ranks))
    return plan.scaled_to_local()


def _node(name: str, **res: float) -> Node:
    return Node(name, "10.0.0.1", res)


def _with_rdma(**params) -> object:
    """pdd.yaml's plan with params on its rdma_tensor edge."""
    from dataclasses import replace

    plan = _plan()
    chans = tuple(
        replace(c, params={**c.params, **params}) if c.kind == "rdma_tensor" else c
        for c in plan.channels
    )
    return replace(plan, channels=chans)


def test_cpu_only_cluster_asks_one_cpu_per_instance_and_does_not_pack_the_rdma_pair():
    nodes = [_node("a", CPU=4, pddflow_cluster_A=1), _node("b", CPU=2, pddflow_cluster_B=1)]
    gs = groups(_plan(), nodes, {})
    assert [g.instances for g in gs] == [["prefill/0"], ["relay/0"], ["main/0"]]
    assert gs[0].bundles == gs[1].bundles == [{"pddflow_cluster_A": 0.001, "CPU": 1.0}]
    assert gs[2].bundles == [{"pddflow_cluster_B": 0.001, "CPU": 1.0}]
    assert problems(_plan(), nodes, {}) == []
    # an edge that asks for shared memory keeps its ends on one node
    packed = groups(_with_rdma(transport="shm"), nodes, {})
    assert [g.instances for g in packed] == [["prefill/0", "relay/0"], ["main/0"]]


def test_gpu_nodes_turn_ranks_into_gpus_and_accelerator_types():
    nodes = [_node("a", CPU=8, GPU=8, pddflow_cluster_A=1), _node("b", CPU=8, pddflow_cluster_B=1)]
    gs = groups(_plan(ranks=4), nodes, {"gpu_a": "H100"})
    assert gs[0].bundles[0] == {
        "pddflow_cluster_A": 0.001,
        "GPU": 4.0,
        "accelerator_type:H100": 0.001,
    }
    assert gs[2].bundles[0] == {"pddflow_cluster_B": 0.001, "CPU": 4.0}  # a CPU each rank
    # the shipped local profile: one rank an instance
    assert groups(_plan(), nodes, {})[0].bundles[0] == {"pddflow_cluster_A": 0.001, "GPU": 1.0}


def test_an_instance_whose_ranks_fit_no_one_node_is_named():
    nodes = [_node(n, CPU=8, GPU=2, pddflow_cluster_A=1) for n in "abcd"] + [
        _node("c", CPU=8, pddflow_cluster_B=1)
    ]
    plan = _plan(ranks=4)
    msgs = [m for _, m in problems(plan, nodes, {}) if "cluster 'A'" in m]
    assert any("prefill/0's 4 ranks must run on one node" in m for m in msgs), msgs


def test_missing_cluster_and_too_few_gpus_are_named_at_the_clusters_line():
    plan = _plan(ranks=4)
    nodes = [_node("a", CPU=8, GPU=2, pddflow_cluster_A=1)]
    found = problems(plan, nodes, {})
    msgs = [m for _, m in found]
    assert "cluster 'A' needs GPU: 8 for its 2 instance(s)" in msgs[0]
    assert "have 2: 6 missing" in msgs[0]
    assert "no live Ray node carries the resource 'pddflow_cluster_B'" in msgs[1]
    lines = Path(PDD).read_text().splitlines()
    ds = diagnostics(plan, found)
    assert (ds[0].line, ds[0].col) == (lines.index("  A: {devices: {gpu_a: 48}}") + 1, 3)
    assert (ds[1].line, ds[1].col) == (lines.index("  B: {devices: {gpu_b: 40}}") + 1, 3)
    assert str(ds[0]).startswith(f"{PDD}:")


def test_an_rdma_pair_split_over_two_nodes_fits_unless_it_asks_for_shared_memory():
    nodes = [
        _node("a1", CPU=1, pddflow_cluster_A=1),
        _node("a2", CPU=1, pddflow_cluster_A=1),
        _node("b", CPU=1, pddflow_cluster_B=1),
    ]
    assert problems(_plan(), nodes, {}) == []  # transport auto: tcp between the two nodes
    (cluster, msg), *rest = problems(_with_rdma(transport="shm"), nodes, {})
    assert cluster == "A" and not rest
    assert "prefill/0, relay/0 share rdma_tensor edges with transport: shm" in msg


def test_transports_per_channel():
    plan = _plan()
    assert transports(plan, {"prefill/0": "10.0.0.1", "relay/0": "10.0.0.1", "main/0": "n2"}) == {
        "prefill.kv->relay.kv": "shared memory",
        "prefill.kv->main.kv": "arrow flight over TCP + token",
        "relay.handoff->main.handoff": "TCP + token",
    }
    split = transports(plan, {"prefill/0": "10.0.0.1", "relay/0": "10.0.0.2"})
    assert split["prefill.kv->relay.kv"] == "tcp (cross-host, checksummed)"
    off = transports(_with_rdma(checksum=""), {"prefill/0": "10.0.0.1", "relay/0": "10.0.0.2"})
    assert off["prefill.kv->relay.kv"] == "tcp (cross-host)"


def test_secure_cross_cluster_turns_on_tls_and_off_emulation():
    from pddflow.runtime.transports import secure_cross_cluster

    plan = secure_cross_cluster(_plan(), emulate=False)
    for ch in plan.channels:
        if ch.cross_cluster:
            assert ch.params["tls"] is True and not ch.params["emulate"]
        else:
            assert not ch.params.get("tls")
    assert all(
        c.params["emulate"]
        for c in secure_cross_cluster(_plan(), emulate=True).channels
        if c.cross_cluster
    )


def test_deploy_section_is_validated_and_the_cli_wins(tmp_path):
    from pddflow.cli import app

    text = Path(PDD).read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + "\ndeploy: {backend: kubernetes}\n")
    r = CliRunner().invoke(app, ["validate", str(bad)])
    assert r.exit_code == 1 and "deploy.backend" in r.output, r.output
    good = tmp_path / "ray.yaml"
    good.write_text(text + "\ndeploy: {backend: ray, address: '10.0.0.1:6379', namespace: x}\n")
    assert CliRunner().invoke(app, ["validate", str(good)]).exit_code == 0
    # --address without the ray backend is refused before anything starts
    r = CliRunner().invoke(app, ["deploy", PDD, "--address", "10.0.0.1:6379", "--port", "0"])
    assert r.exit_code == 2 and "--address is for --backend ray" in r.output, r.output


def test_plan_says_how_each_backend_carries_each_edge():
    from pddflow.cli import app

    r = CliRunner().invoke(app, ["plan", PDD, "--json"])
    import json

    rows = {t["channel"]: t for t in json.loads(r.output)["transports"]}
    assert rows["prefill.kv->relay.kv"]["local"] == "shared memory"
    assert rows["prefill.kv->relay.kv"]["ray"] == (
        "shared memory where ends share a host, else tcp (nixl where installed)"
    )
    assert rows["prefill.kv->main.kv"]["ray"] == "arrow flight over TCP+TLS + token"
    assert rows["relay.handoff->main.handoff"]["local"].startswith("TCP + token")


def test_servers_bind_the_published_address_unless_asked_for_every_interface():
    from pddflow.runtime.wiring import Wiring

    w = Wiring("d", "{}", "10.1.0.10:2000")
    assert w.bind_host("grpc://10.2.0.7:3000") == "10.2.0.7"
    assert w.bind_host("10.2.0.7:3001") == "10.2.0.7"
    assert w.bind_host("[fd00::7]:3002") == "fd00::7"
    w.bind_all = True
    assert w.bind_host("grpc://10.2.0.7:3000") == "0.0.0.0"
