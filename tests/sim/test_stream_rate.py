"""The declared per-stream rate (links.X-Y.stream_gbps, or tcp_window_mib / rtt_ms) is the one
transfer limit `plan`, `simulate` and `size` all use."""

from __future__ import annotations

from pathlib import Path

import pytest

from pddflow.core.link import window_stream_gbps
from pddflow.graph import load_plan
from pddflow.graph.feasibility import Load, analyze
from pddflow.sim.agentic import AgenticConfig, generate
from pddflow.sim.metrics import summarize
from pddflow.sim.runner import with_stream_gbps
from pddflow.sim.simulator import Simulation

ROOT = Path(__file__).resolve().parents[2]
PDD = ROOT / "graphs" / "sim" / "pdd_88.yaml"
DECLARED = "stream_gbps: 2.5,"


def _variant(tmp_path: Path, replacement: str) -> Path:
    text = PDD.read_text()
    assert DECLARED in text
    out = tmp_path / "g.yaml"
    out.write_text(text.replace(DECLARED, replacement))
    return out


def test_default_is_window_over_rtt(tmp_path):
    p = load_plan(str(_variant(tmp_path, "")))  # nothing declared: 8 MiB over 30 ms
    assert p.links["A-B"].stream_gbps == pytest.approx(8 * 2**20 * 8 / 0.030 / 1e9)
    assert p.flow_cap_gbps("A-B") == pytest.approx(4 * window_stream_gbps(8, 30))
    p = load_plan(str(_variant(tmp_path, "tcp_window_mib: 4,")))
    assert p.links["A-B"].stream_gbps == pytest.approx(window_stream_gbps(4, 30))
    assert window_stream_gbps(4, 30) == pytest.approx(1.118, abs=1e-3)
    p = load_plan(str(_variant(tmp_path, "stream_gbps: 0,")))
    assert p.flow_cap_gbps("A-B") == 0.0  # declared: no per-stream limit


def test_plan_transfer_time_follows_the_declared_rate(tmp_path):
    load = Load(rps=1.0, prompt_tokens=65536, hit_rate=0.9)
    times = {}
    for gbps in (2.5, 5.0):
        p = load_plan(str(_variant(tmp_path, f"stream_gbps: {gbps},")))
        rep = analyze(p, load).links[0]
        assert (rep.stream_gbps, rep.streams, rep.flow_cap_gbps) == (gbps, 4, 4 * gbps)
        cold = next(c for c in rep.classes if c.name == "cold")
        link = p.links["A-B"]
        # the cap binds (an idle 100 Gbps link): bytes at streams x stream rate
        expect = link.transfer_quantile_s(0, 0.5) + cold.kv_bytes * 8 / (4 * gbps * 1e9)
        assert cold.transfer_p50_s == pytest.approx(expect, rel=1e-3)
        times[gbps] = cold.transfer_p50_s - link.transfer_quantile_s(0, 0.5)
    assert times[2.5] == pytest.approx(2 * times[5.0], rel=1e-3)


def _run(plan, **kw) -> tuple[Simulation, dict]:
    wl = generate(AgenticConfig(requests=150, rps=4.0, first_prompt_tokens=16000, seed=1))
    sim = Simulation(plan, wl, seed=1, **kw)
    sim.run()
    return sim, summarize(sim)


def test_simulate_uses_the_declared_rate_and_the_override_is_the_same(tmp_path):
    slow = load_plan(str(_variant(tmp_path, "stream_gbps: 1.0,")))
    fast = load_plan(str(_variant(tmp_path, "stream_gbps: 5.0,")))
    s_slow, m_slow = _run(slow)
    s_fast, m_fast = _run(fast)
    assert s_slow.links["A-B"].cap == pytest.approx(slow.flow_cap_gbps("A-B") * 1e9 / 8)
    assert s_fast.links["A-B"].cap == pytest.approx(fast.flow_cap_gbps("A-B") * 1e9 / 8)
    assert m_slow["wan_transfer_s"]["p90"] > m_fast["wan_transfer_s"]["p90"]
    # `simulate --stream-gbps 5` on the 1 Gbps graph is the graph that declares 5
    _, m_override = _run(with_stream_gbps(slow, 5.0))
    assert m_override["wan_transfer_s"] == m_fast["wan_transfer_s"]
    assert m_override["ttft_s"] == m_fast["ttft_s"]
    _, m_kw = _run(slow, stream_gbps=5.0)
    assert m_kw["ttft_s"] == m_fast["ttft_s"]
