"""Feasibility arithmetic against PDD.md's worked example and the link model."""

from __future__ import annotations

from pathlib import Path

import pytest

from pddflow.core.link import Jitter, LinkModel
from pddflow.graph import load_plan
from pddflow.graph.feasibility import Load, analyze

BASE = (Path(__file__).parent / "base.yaml").read_text()
# PDD's working figure: 50 KB of KV per token.
PDD_ARCH = "arch: {kv_bytes_per_token: 50000, flops_per_token: 1.4e11, weight_bytes: 140000000000}"


def _plan(tmp_path: Path, text: str):
    p = tmp_path / "g.yaml"
    p.write_text(text)
    return load_plan(str(p))


def test_pdd_worked_example(tmp_path: Path):
    """100K-token prompts at 50 KB/token are 5 GB each; 4.5 of them per second need 180 Gbps;
    a 90% hit rate cuts that 10x (PDD.md, Feasibility)."""
    plan = _plan(
        tmp_path,
        BASE.replace("arch: llama-3-70b", PDD_ARCH)
        .replace("max_context: 32768", "max_context: 131072")
        .replace("gbps: 100", "gbps: 400"),
    )
    cold = analyze(plan, Load(rps=4.5, prompt_tokens=100_000, output_tokens=1, hit_rate=0.0)).links[
        0
    ]
    assert cold.classes[0].kv_bytes == pytest.approx(5e9)
    assert cold.required_gbps == pytest.approx(180.0, rel=1e-3)
    warm = analyze(plan, Load(rps=4.5, prompt_tokens=100_000, output_tokens=1, hit_rate=0.9)).links[
        0
    ]
    assert warm.required_gbps_without_drc == pytest.approx(180.0, rel=1e-3)
    assert warm.required_gbps == pytest.approx(18.0, rel=1e-2)


def test_verdict_names_the_overloaded_link(tmp_path: Path):
    plan = _plan(
        tmp_path,
        BASE.replace("arch: llama-3-70b", PDD_ARCH).replace(
            "max_context: 32768", "max_context: 131072"
        ),
    )
    r = analyze(plan, Load(rps=10, prompt_tokens=100_000, hit_rate=0.5))
    assert not r.feasible and "link A-B" in r.problems[0] and "100 Gbps" in r.problems[0]


def test_drc_is_credited_only_where_the_receiver_keeps_a_cache(tmp_path: Path):
    text = BASE.replace(
        "main: {op: main_decode, cluster: B, device: gpu_b, replicas: 2, devices_per_replica: 4}",
        "main: {op: main_decode, cluster: B, device: gpu_b, replicas: 2, devices_per_replica: 4, "
        "params: {radix_cache: false}}",
    )
    link = analyze(_plan(tmp_path, text), Load(rps=1, prompt_tokens=10_000, hit_rate=0.9)).links[0]
    assert link.required_gbps == pytest.approx(link.required_gbps_without_drc)


def test_cold_transfer_over_sla_without_relay_is_a_problem(tmp_path: Path):
    text = BASE.replace("  p_rld_md: {path: [prefill, relay, main], handoff: adaptive}\n", "")
    r = analyze(_plan(tmp_path, text), Load(rps=0.1, prompt_tokens=200_000, hit_rate=0.9))
    assert any("TTFT SLA" in p and "relay" in p for p in r.problems)
    r = analyze(_plan(tmp_path, BASE), Load(rps=0.1, prompt_tokens=200_000, hit_rate=0.9))
    assert r.feasible and any("relay variant hides it" in n for n in r.notes)


def test_link_model_quantiles_and_sampling():
    import random

    link = LinkModel("w", "A", "B", gbps=8, rtt_ms=10, jitter=Jitter(50, 2000, "lognormal"))
    assert link.transfer_quantile_s(1e9, 0.5) == pytest.approx(0.010 + 0.050 + 1.0)
    assert link.transfer_quantile_s(0, 0.99) == pytest.approx(0.010 + 2.0)
    rng = random.Random(7)
    samples = sorted(link.jitter.sample_ms(rng) for _ in range(20000))
    assert samples[10000] == pytest.approx(50, rel=0.1)
    assert samples[19800] == pytest.approx(2000, rel=0.25)
    assert Jitter(5, 5, "constant").sample_ms(rng) == 5
