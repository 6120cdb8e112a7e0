"""Plugins extend the registries through entry points (docs/plugins.md shows the same package)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pddflow.core.registry import Registry, UnknownName

PLUGIN = """
from pddflow.core.operator_types import OperatorType, Param
from pddflow.core.payloads import Payload
from pddflow.core.channel_kinds import ChannelKind

def operators(registry):
    registry.register("kv_forwarder", OperatorType(
        "kv_forwarder", "re-sends KV it receives (a store-and-forward hop)",
        inputs={"kv": Payload.KV_BLOCKS}, outputs={"kv_out": Payload.KV_BLOCKS}, role="decode",
        params={"hold_ms": Param(int, 0, "delay before forwarding")}))

def channels(registry):
    registry.register("carrier_pigeon", ChannelKind(
        "carrier_pigeon", "KV by bird", frozenset({Payload.KV_BLOCKS}), "any"))
"""

GRAPH = (Path(__file__).parent / "base.yaml").read_text()


def _install_plugin(root: Path) -> dict[str, str]:
    (root / "demo_plugin.py").write_text(PLUGIN)
    dist = root / "demo_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[pddflow.operators]\ndemo = demo_plugin:operators\n\n"
        "[pddflow.channels]\ndemo = demo_plugin:channels\n"
    )
    return {**os.environ, "PYTHONPATH": str(root)}


def _validate(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pddflow.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.mark.slow  # two `pddflow validate` subprocesses
def test_plugin_operator_and_channel_validate(tmp_path: Path):
    env = _install_plugin(tmp_path)
    g = GRAPH.replace(
        "  - {from: prefill.kv, to: main.kv, channel: wan_flight}\n",
        "  - {from: prefill.kv, to: hop.kv, channel: rdma_tensor}\n"
        "  - {from: hop.kv_out, to: main.kv, channel: carrier_pigeon}\n",
    )
    g = g.replace(
        "edges:",
        "  hop: {op: kv_forwarder, cluster: A, device: gpu_a, devices_per_replica: 4, "
        "params: {hold_ms: 5}}\nedges:",
    )
    g = g.replace("p_md: {path: [prefill, main]}", "p_md: {path: [prefill, hop, main]}")
    path = tmp_path / "g.yaml"
    path.write_text(g)
    done = _validate(path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    # without the plugin the same file names the unknown type and kind
    done = _validate(path, {k: v for k, v in env.items() if k != "PYTHONPATH"})
    assert done.returncode == 1
    assert "unknown operator type 'kv_forwarder'" in done.stdout


@pytest.mark.slow  # a `pddflow validate` subprocess
def test_cycle_is_reported(tmp_path: Path):
    env = _install_plugin(tmp_path)
    g = GRAPH.replace(
        "edges:",
        "  hop1: {op: kv_forwarder, cluster: A, device: gpu_a}\n"
        "  hop2: {op: kv_forwarder, cluster: A, device: gpu_a}\nedges:\n"
        "  - {from: hop1.kv_out, to: hop2.kv, channel: rdma_tensor}\n"
        "  - {from: hop2.kv_out, to: hop1.kv, channel: rdma_tensor}",
    )
    g = g.replace("llama-3-70b", "llama-3-8b")
    path = tmp_path / "cycle.yaml"
    path.write_text(g)
    done = _validate(path, env)
    assert done.returncode == 1, done.stdout
    assert "form a cycle" in done.stdout and "Traceback" not in done.stderr


def test_registry_error_lists_valid_names():
    reg: Registry[int] = Registry("widget", "pddflow.test-no-such-group")
    reg.register("alpha", 1)
    reg.register("beta", 2)
    with pytest.raises(UnknownName) as exc:
        reg.get("alpah")
    assert "did you mean 'alpha'" in str(exc.value) and "alpha, beta" in str(exc.value)
    with pytest.raises(ValueError):
        reg.register("alpha", 3)
