"""Shared fixtures of the simulator tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def serve_trace(tmp_path: Path) -> Path:
    """A 12-request Mooncake-format trace with growing prompts, enough for `--serve-workload`
    sessions of a few turns."""
    f = tmp_path / "trace.jsonl"
    lines = []
    for i in range(12):
        inp = 512 * (3 + i % 5) - 100
        lines.append(
            json.dumps(
                {
                    "timestamp": i * 100,
                    "input_length": inp,
                    "output_length": 40 + 37 * i,
                    "hash_ids": [0] + [1000 * i + k for k in range(1, -(-inp // 512))],
                }
            )
        )
    f.write_text("\n".join(lines) + "\n")
    return f


# The sizing tests' chain of three operators: a (2 devices of $1 a replica: $2) and b (1 device:
# $1) share cluster A's 8 devices; c ($3, one device) has cluster B's 4. Their analytic scores
# stand in for the simulator: goodput is the slowest stage (test_sizing.py: a serving 4 req/s a
# replica, b 6, c 3).
THREE_CHAIN = """
pddflow: 1
name: three
model:
  weights: builtin:tiny-llama
  arch: {kv_bytes_per_token: 1024, flops_per_token: 1.0e9, weight_bytes: 1000000000}
  max_context: 8192
device_classes:
  ga: {tflops: 100, hbm_gib: 16, hbm_tbps: 1, net_gbps: 100, usd_per_hour: 1.0}
  gb: {tflops: 100, hbm_gib: 16, hbm_tbps: 1, net_gbps: 100, usd_per_hour: 3.0}
clusters:
  A: {devices: {ga: 8}}
  B: {devices: {gb: 4}}
links:
  A-B: {gbps: 10, rtt_ms: 20}
operators:
  a: {op: prefill, cluster: A, device: ga, replicas: 1, devices_per_replica: 2}
  b: {op: relay_decode, cluster: A, device: ga, replicas: 1}
  c: {op: main_decode, cluster: B, device: gb, replicas: 1}
edges:
  - {from: a.kv, to: b.kv, channel: rdma_tensor}
  - {from: a.kv, to: c.kv, channel: wan_flight}
  - {from: b.handoff, to: c.handoff, channel: token_ids}
variants:
  p_md: {path: [a, c]}
  p_rld_md: {path: [a, b, c], handoff: one_shot}
"""


@pytest.fixture(scope="session")
def three_chain_yaml() -> str:
    """The graph text of the sizing tests' three-operator chain."""
    return THREE_CHAIN
