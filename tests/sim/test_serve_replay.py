"""`pddflow simulate --serve-workload` replays exactly the sessions `pddflow bench serve` sends
(same builder, now in pddflow.core), closed-loop, and the simulator never imports the runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pddflow.core.serve_sessions import build
from pddflow.sim.calibration import Calibration, HostSpec
from pddflow.sim.calibration.host import CpuShare, HostCpus
from pddflow.sim.engine import StepKind
from pddflow.sim.serve_replay import replay, serve_workload
from pddflow.sim.simulator import Simulation

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("seed", [0, 7])
def test_replay_matches_the_bench_workload(serve_trace, seed):
    trace = serve_trace
    spec = build(trace, 3, 4, 1 / 32, vocab=256, seed=seed, max_output=128)
    wl = serve_workload(trace, 3, 4, 16, seed=seed, rps=2.0, think_s=1.0)
    assert len(wl.requests) == spec.requests == 12
    by_session = {}
    roots = [r for r in wl.requests if r.parent < 0]
    assert [r.arrival_s for r in roots] == [0.0, 0.5, 1.0]  # session i starts at i / rps
    for r in roots:
        chain, cur = [r], r
        while True:
            nxt = [c for c in wl.requests if c.parent == cur.rid]
            if not nxt:
                break
            assert len(nxt) == 1 and nxt[0].gap_s == 1.0  # closed loop, think time
            cur = nxt[0]
            chain.append(cur)
        by_session[len(by_session)] = chain
    for i, s in enumerate(spec.sessions):
        chain = by_session[i]
        assert [r.output_tokens for r in chain] == s.output_tokens
        # turn k's prompt: the first prompt, every earlier output (max_tokens) and user message
        ctx = len(s.first_prompt)
        for k, r in enumerate(chain):
            if k:
                ctx += s.output_tokens[k - 1] + len(s.user_turns[k - 1])
            assert r.prompt_tokens == ctx
            assert len(r.hashes) == ctx // 16
            # the next turn shares every full block of this turn's prompt + output
            if k + 1 < len(chain):
                assert chain[k + 1].hashes[: len(r.done_hashes)] == r.done_hashes
                assert r.done_hashes[: len(r.hashes)] == r.hashes


def test_replay_runs_on_the_local_profile_with_a_shared_cpu(serve_trace):
    from dataclasses import replace

    trace = serve_trace
    spec = build(trace, 2, 3, 1 / 32, vocab=256)
    plan = _local_plan()
    plan = replace(plan, links={n: replace(link, gbps=0.05) for n, link in plan.links.items()})
    wl = replay(spec, plan.model.block_size)
    sim = Simulation(plan, wl, calibration=Calibration(host=HostSpec(2)))
    cpu = sim.host
    # as the runtime pins them on 2 cores: cluster A (prefill, relay) on one, B (main) on the other
    assert len(cpu.groups) == 2 and cpu.mode == "cluster"
    assert sorted(sorted(e.name for e in g.engines) for g in cpu.groups) == [
        ["main/0"],
        ["prefill/0", "relay/0"],
    ]
    flights = sim.run()
    assert len(flights) == 6 and all(r.done and not r.failed for r in flights)
    # as the runtime's reused_blocks: the block holding the prompt's last token always travels
    page = plan.model.block_size * plan.model.arch.kv_bytes_per_token
    kv_bytes = sim.fleet.kv_bytes
    assert kv_bytes(32, hit_blocks=2) == page and kv_bytes(33, hit_blocks=2) == page
    assert kv_bytes(33, hit_blocks=0) == 3 * page


def _local_plan():
    from pddflow.commands.common import load_or_exit

    return load_or_exit(ROOT / "graphs" / "pdd.yaml").scaled_to_local()


@pytest.mark.slow
def test_sim_does_not_import_the_runtime():
    code = (
        "import sys\n"
        "import pddflow.sim.serve_replay, pddflow.sim.simulator, pddflow.commands.sim_cmds\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('pddflow.runtime'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == ""


def test_prefill_overhead_fit_reproduces_both_prefill_points(tmp_path):
    """Two prefill sizes whose time grows slower than the FLOPs: a fixed prefill-call cost plus an
    achieved FLOP/s reproduce both; a noisy short point (negative overhead) falls back to
    all-compute."""
    from pddflow.sim.calibration.bench_files import load_bench
    from pddflow.sim.calibration.engine_fit import fit

    def cal(p64, p128):
        doc = {
            "model": "builtin:tiny-llama",
            "threads": 1,
            "prefill": {"64": {"engine_tok_s": p64}, "128": {"engine_tok_s": p128}},
            "decode": {"context": 32, "1": {"engine_tok_s": 17.2}, "4": {"engine_tok_s": 63.7}},
        }
        f = tmp_path / f"e{p64}.json"
        f.write_text(json.dumps(doc))
        c = fit(load_bench(f))
        return c, c.model()

    c, m = cal(344.2, 456.8)
    assert c.facts.threads == 1 and c.efficiency.prefill_overhead_s > 0
    assert m.prefill_tokens_per_s(64) == pytest.approx(344.2, rel=1e-6)
    assert m.prefill_tokens_per_s(128) == pytest.approx(456.8, rel=1e-6)
    c, m = cal(28.9, 267.9)  # the short point paid a warm-up: no overhead, the long point alone
    assert c.efficiency.prefill_overhead_s == 0
    assert m.prefill_tokens_per_s(128) == pytest.approx(267.9, rel=1e-6)


@pytest.mark.slow
def test_cli_serve_workload(tmp_path, serve_trace):
    trace = serve_trace
    bench = tmp_path / "engine.json"
    bench.write_text(
        json.dumps(
            {
                "model": "builtin:tiny-llama",
                "threads": 1,
                "prefill": {"64": {"engine_tok_s": 344.2}, "128": {"engine_tok_s": 456.8}},
                "decode": {"context": 32, "1": {"engine_tok_s": 17.2}, "4": {"engine_tok_s": 63.7}},
            }
        )
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pddflow.cli",
            "simulate",
            str(ROOT / "graphs" / "pdd.yaml"),
            "--serve-workload",
            "--trace",
            str(trace),
            "--sessions",
            "3",
            "--turns",
            "3",
            "--wan-gbps",
            "0.05",
            "--calibrate",
            str(bench),
            "--json",
            "-q",
            "--per-request",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["requests"] == 9 and d["failed"] == 0
    groups = d["cpu_share"]["groups"]
    assert sorted(i for g in groups for i in g["instances"]) == ["main/0", "prefill/0", "relay/0"]
    assert d["ttft_s"]["p50"] > 0
    rows = d["per_request"]  # keyed like `bench serve --per-request`: session, turn
    assert [(r["session"], r["turn"]) for r in rows] == [(s, t) for s in range(3) for t in range(3)]
    assert all(r["ttft_s"] > 0 and r["prefill_done_s"] > 0 for r in rows)
    first, later = rows[0], rows[1]
    assert first["prefill_hit_tokens"] == 0 and later["prefill_hit_tokens"] > 0
    # KV to main travels in whole pages: a cold prompt's last, partial block too
    page = 16 * 32768
    assert (
        first["kv_bytes"] == -(-first["prompt_tokens"] // 16) * page
        and later["kv_bytes"] % page == 0
    )


def test_cpu_share_weights_a_lower_priority_decoder_like_cfs():
    """One core, prefill and a nice +5 relay both busy: prefill gets ~3/4 of it, the relay ~1/4
    (CFS weights 1024 and 335); alone, either runs at full speed."""
    from types import SimpleNamespace

    plan = _local_plan()
    share = CpuShare(1.0, 1, HostCpus(plan, HostSpec(1)))
    p = SimpleNamespace(name="prefill/0", busy=False, replan=lambda: None)
    r = SimpleNamespace(name="relay/0", busy=False, replan=lambda: None)
    share.attach(p)
    share.attach(r, nice=5)
    p.busy = True
    assert p.slowdown(StepKind.PREFILL) == pytest.approx(1.0)
    r.busy = True
    w = 1.25**-5
    assert p.slowdown(StepKind.PREFILL) == pytest.approx(1 + w)
    assert r.slowdown(StepKind.DECODE) == pytest.approx((1 + w) / w)
    p.busy = False
    assert r.slowdown(StepKind.DECODE) == pytest.approx(1.0)


def test_corun_slows_a_group_only_while_another_group_is_busy():
    """Cores pinned apart still share cache and memory: with the co-run factors a prefill step on
    cluster A's core takes longer while main decodes on B's, a decode step its own factor, and
    nothing changes while B is idle; going busy makes the other group re-plan."""
    from types import SimpleNamespace

    plan = _local_plan()
    cpu = HostCpus(plan, HostSpec(2, corun=(1.2, 1.5)))
    replans = []
    engines = {
        i.id: SimpleNamespace(name=i.id, busy=False, replan=lambda n=i.id: replans.append(n))
        for i in plan.instances
    }
    for name, e in engines.items():
        cpu.attach(name, e)
    p, m = engines["prefill/0"], engines["main/0"]
    p.busy = True
    p.on_busy(p)
    assert p.slowdown(StepKind.PREFILL) == pytest.approx(1.0) and "main/0" in replans
    replans.clear()
    m.busy = True
    m.on_busy(m)
    assert sorted(replans) == ["prefill/0", "relay/0"]
    assert p.slowdown(StepKind.EXTEND) == pytest.approx(1.2)
    assert p.slowdown(StepKind.DECODE) == pytest.approx(1.5)
    assert m.slowdown(StepKind.DECODE) == pytest.approx(1.5)
    assert HostCpus(plan, HostSpec(2)).to_dict()["corun"] == {"prefill": 1.0, "decode": 1.0}


def test_a_prefill_wall_factor_scales_prefill_steps_only():
    """A deployment's measured prefill wall beyond the CPU share applies to the instance's
    prefill steps, not to its decode-only steps or extends."""
    from types import SimpleNamespace

    plan = _local_plan()
    cpu = HostCpus(plan, HostSpec(2, prefill_wall={"main/0": 1.5}))
    m = SimpleNamespace(name="main/0", busy=True, replan=lambda: None)
    cpu.attach("main/0", m)
    assert m.slowdown(StepKind.DECODE) == pytest.approx(1.0)
    assert m.slowdown(StepKind.PREFILL) == pytest.approx(1.5)
    assert m.slowdown(StepKind.EXTEND) == pytest.approx(1.0)
