"""Calibration beyond two prefill lengths: the prefill grid of `pddflow bench engine`, and the
deployment's own facts from a `pddflow bench serve --json --per-request` report (its prefills' CPU
against the engine fit, the serving path's CPU per token)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pddflow.core.arch import ARCHS
from pddflow.sim.calibrate import (
    CalibrationError,
    ServeFacts,
    fit,
    is_serve_report,
    load_bench,
    load_serve,
)
from pddflow.sim.device import DeviceModel

ROOT = Path(__file__).resolve().parents[2]
SPREAD = (1.0, 0.8, 1.5, 1.0, 0.9, 1.2)  # median 1
DECODE_FACTOR = 1.6  # the reports' decode steps over the engine fit
ENGINE = {
    "model": "builtin:tiny-llama",
    "threads": 1,
    "prefill": {"64": {"engine_tok_s": 1300.0}, "128": {"engine_tok_s": 1200.0}},
    "decode": {"context": 32, "1": {"engine_tok_s": 60.0}, "4": {"engine_tok_s": 230.0}},
    "extend": {"tokens": 16, "context": 48, "extend_ms": 25.0},
}


def _truth_ms(new: int, cached: int) -> float:
    """A prefill cost of the model's own form: 12 ms fixed, 0.15 TFLOP/s, attention at 4x."""
    arch = ARCHS.get("tiny-llama")
    pairs = new * cached + new * new / 2
    return (
        12.0
        + (new * arch.flops_per_token + pairs * arch.attention_flops_per_pair * 4.0) / 0.15e12 * 1e3
    )


def _engine_with_grid(tmp_path: Path) -> Path:
    doc = dict(ENGINE)
    doc["prefill"] = {str(n): {"engine_tok_s": n / _truth_ms(n, 0) * 1e3} for n in (64, 128)}
    shapes = [
        (32, 0),
        (256, 0),
        (512, 0),
        (32, 256),
        (128, 256),
        (256, 256),
        (32, 768),
        (128, 768),
        (256, 768),
    ]
    doc["prefill_grid"] = {
        "statistic": "median of 3",
        "points": [{"tokens": n, "cached": c, "prefill_ms": _truth_ms(n, c)} for n, c in shapes],
    }
    f = tmp_path / "engine.json"
    f.write_text(json.dumps(doc))
    return f


def test_prefill_grid_fits_fixed_cost_rate_and_attention(tmp_path):
    """Two cold lengths cannot tell a fixed cost from attention; the grid over cached prefixes can,
    and the fit then reproduces prompts it never measured."""
    cal = fit(load_bench(_engine_with_grid(tmp_path)))
    m = DeviceModel(cal.device, 1, cal.arch, cal.efficiency)
    assert cal.efficiency.job_overhead_s == pytest.approx(0.012, rel=1e-3)
    assert cal.efficiency.attn_factor == pytest.approx(4.0, rel=1e-3)
    for new, cached in ((31, 208), (150, 600), (400, 100)):
        assert m.prefill_s(new, cached) * 1e3 == pytest.approx(_truth_ms(new, cached), rel=1e-3)
    check = cal.to_dict()["prefill_grid_check"]
    assert len(check) == 9 and all(
        c["model_ms"] == pytest.approx(c["measured_ms"], rel=1e-3) for c in check
    )


def test_without_a_grid_the_exact_fits_remain(tmp_path):
    f = tmp_path / "engine.json"
    f.write_text(json.dumps(ENGINE))
    cal = fit(load_bench(f))
    m = DeviceModel(cal.device, 1, cal.arch, cal.efficiency)
    assert m.prefill_tokens_per_s(128) == pytest.approx(1200, rel=1e-6)
    assert cal.to_dict()["prefill_grid_check"] == [] and cal.to_dict()["deployment"] is None


def _serve_report(
    tmp_path: Path,
    factors: dict[str, float],
    per_token_ms: dict[str, float],
    decode_factor: float = DECODE_FACTOR,
    wall_over_cpu: dict[str, float] | None = None,
    prefill_wall_over_cpu: float | None = None,
) -> Path:
    """A `bench serve --json --per-request` report whose prefills took `factor` x the engine fit,
    spread around it as SPREAD, and 1.3x their CPU in wall time (`prefill_wall_over_cpu`: that
    ratio, and the sends name their instance, as the runtime's do)."""
    cal = fit(load_bench(_engine_with_grid(tmp_path)))
    m = DeviceModel(cal.device, 1, cal.arch, cal.efficiency)
    graphs = []
    for name, factor in factors.items():
        rows = []
        for i, (prompt, cached) in enumerate(
            [(211, 0), (360, 208), (497, 352), (72, 16), (635, 496), (239, 208)]
        ):
            cpu_ms = m.prefill_s(prompt - cached, cached) * 1e3 * factor * SPREAD[i]
            wall_ms = cpu_ms * (prefill_wall_over_cpu or 1.3)
            queued = 100.0 if i >= 4 else 0.0  # the last two queued 100 ms first
            end = 3.0 + queued + wall_ms  # (the job reached the worker 3 ms after the frontend)
            send = {
                "t_ms": end + 2.0,
                "prefill_cpu_ms": cpu_ms,
                "cached_tokens": cached,
                "prefill_ms": wall_ms,
                "export_ms": 2.0,
                "bytes": 4e6,
                "queued_ms": queued,
            }
            if prefill_wall_over_cpu is not None:
                send["instance"] = "prefill/0"
            wan = {
                **send,
                "t_ms": end + 7.0 + i,
                "export_ms": 5.0 + i,
                "bytes": 1e6,
            }  # after the relay's copy
            first_ms = end + 2.0 + 10.0 * (i + 1) + 1.0
            rows.append(
                {
                    "session": i,
                    "turn": 0,
                    "prompt_tokens": prompt,
                    "ttft_s": (first_ms + 4.0) / 1e3,
                    "events": [
                        {"event": "arrival", "t_ms": 0.0},
                        {"event": "kv_send:rdma_tensor:relay/0", **send},
                        {"event": "kv_send:wan_flight:main/0", **wan},
                        {
                            "event": "kv_sent:rdma_tensor:relay/0",
                            "t_ms": end + 2.0 + 10.0 * (i + 1),
                        },
                        {"event": "first_token", "t_ms": first_ms},
                    ],
                }
            )  # the client saw it 4 ms later
        decode = {}
        for inst, (steps, seqs, ctx) in {
            "relay/0": (100, 150, 60_000),
            "main/0": (400, 1600, 800_000),
        }.items():
            model_s = (
                steps * (m.wt / m.bytes_s + m.ovh) + ctx * m.kvb / m.bytes_s + seqs * m.seq_ovh
            )
            decode[inst] = {
                "steps": steps,
                "cpu_s": model_s * decode_factor,
                "seqs": seqs,
                "context_tokens": ctx,
            }
            if wall_over_cpu and inst in wall_over_cpu:
                decode[inst]["wall_s"] = decode[inst]["cpu_s"] * wall_over_cpu[inst]
        graphs.append(
            {
                "graph": f"graphs/{name}.yaml",
                "per_request": rows,
                "decode_steps": decode,
                "host_cpu": {
                    "frontend_s": 1.0,
                    "client_s": 0.5,
                    "output_tokens": 1000,
                    "ms_per_token": per_token_ms[name],
                },
            }
        )
    f = tmp_path / "serve.json"
    f.write_text(json.dumps({"workload": {"sessions": 6}, "graphs": graphs}))
    return f


def test_deployment_calibration_per_graph(tmp_path):
    """Each graph takes its own deployment's prefill factor and serving CPU; a graph the report did
    not serve takes them pooled; the prefill-like costs scale, decode does not."""
    serve = _serve_report(
        tmp_path, {"pdd": 1.3, "cross_dc_pd": 1.1}, {"pdd": 1.7, "cross_dc_pd": 1.4}
    )
    assert is_serve_report(serve) and not is_serve_report(_engine_with_grid(tmp_path))
    facts = load_serve([serve])
    base = fit(load_bench(_engine_with_grid(tmp_path)))
    pdd = base.for_graph(facts, "graphs/pdd.yaml")
    assert pdd.prefill_host_factor == pytest.approx(1.3, rel=1e-6)
    assert pdd.serving_cpu_per_token_s == pytest.approx(1.7e-3)
    m0, m1 = (DeviceModel(c.device, 1, c.arch, c.efficiency) for c in (base, pdd))
    assert m1.prefill_s(150, 300) == pytest.approx(1.3 * m0.prefill_s(150, 300), rel=1e-9)
    # decode steps at the deployment's measured CPU over the fit (memory-bound steps scale exactly)
    assert pdd.decode_host_factor == pytest.approx(DECODE_FACTOR, rel=1e-6)
    assert m1.decode_step_s(4, 2000) == pytest.approx(
        DECODE_FACTOR * m0.decode_step_s(4, 2000), rel=1e-6
    )
    other = base.for_graph(facts, "graphs/same_dc_pd.yaml")
    assert 1.1 < other.prefill_host_factor < 1.3 and other.serving_cpu_per_token_s == pytest.approx(
        1.55e-3
    )
    d = pdd.to_dict()["deployment"]
    assert d["prefills"] == 6 and d["prefill_host_factor"] == pytest.approx(1.3, rel=1e-4)
    assert d["decode_steps"] == 500 and d["decode_host_factor"] == pytest.approx(
        DECODE_FACTOR, rel=1e-4
    )
    assert pdd.prefill_spread == pytest.approx(sorted(SPREAD))
    # prefill end -> KV on the relay: export (2 ms) + send to ack (10, 20, ... 60 ms)
    assert pdd.relay_handovers == pytest.approx([0.012, 0.022, 0.032, 0.042, 0.052, 0.062])
    assert pdd.relay_handovers_queued == pytest.approx(
        [0.052, 0.062]
    )  # the two prefills that queued
    # prefill end -> its last KV copy exported (the worker's loop is busy until then): 7, 8, ... 12 ms
    # for 5 MB, per byte
    assert pdd.prefill_shipping == pytest.approx([(0.007 + 0.001 * i) / 5e6 for i in range(6)])
    q = d["prefill_shipping_ms_per_mb"]
    assert 1.4 <= q[0.1] < q[0.5] < q[0.9] <= 2.4
    assert base.for_graph(None, "graphs/pdd.yaml") is base
    # client -> worker (3 ms) and first token -> client (4 ms), whether the prefill queued or not
    assert pdd.serving_latency_s == pytest.approx(0.007) and d["serving_latency_ms"][
        0.5
    ] == pytest.approx(7.0)
    assert (
        pdd.prefill_wall_ratios == {} and d["prefill_wall_over_cpu"] is None
    )  # (the sends name no instance)
    walled = base.for_graph(
        load_serve(
            [_serve_report(tmp_path, {"pdd": 1.3}, {"pdd": 1.7}, prefill_wall_over_cpu=1.45)]
        ),
        "graphs/pdd.yaml",
    )
    assert walled.prefill_wall_ratios == pytest.approx({"prefill/0": 1.45})
    assert walled.to_dict()["deployment"]["prefill_wall_over_cpu"] == {"prefill/0": 1.45}


def test_prefill_size_trend_is_taken_out_of_the_spread(tmp_path):
    """Deployment prefills that drift from the model with their size (here 1.2 x (n / 100) ** -0.1:
    long prompts cheaper than the fit extrapolates) give that trend, not a wide spread; the replay
    then costs a 2,700-token prefill at the trend, and prompts of one size give no trend."""
    base = fit(load_bench(_engine_with_grid(tmp_path)))
    m = DeviceModel(base.device, 1, base.arch, base.efficiency)
    sizes = [30, 60, 100, 150, 250, 400, 800, 2700]
    prefills = tuple((n + 16, 16, 1.2 * (n / 100) ** -0.1 * m.prefill_s(n, 16)) for n in sizes)
    cal = base.with_serve(ServeFacts("t", None, prefills))
    exponent, ref = cal.prefill_size_trend
    assert exponent == pytest.approx(-0.1, abs=1e-6) and 30 < ref < 2700
    assert cal.prefill_spread == pytest.approx([1.0] * len(sizes), abs=1e-3)
    m1 = DeviceModel(cal.device, 1, cal.arch, cal.efficiency)
    for n in (30, 2700):  # scaled model x trend = what was measured
        assert m1.prefill_s(n, 16) * (n / ref) ** exponent == pytest.approx(
            1.2 * (n / 100) ** -0.1 * m.prefill_s(n, 16), rel=1e-3
        )
    assert cal.to_dict()["deployment"]["prefill_size_trend"]["exponent"] == pytest.approx(
        -0.1, abs=1e-4
    )
    flat = base.with_serve(
        ServeFacts("t", None, tuple((116, 16, 1.3 * m.prefill_s(100, 16)) for _ in range(6)))
    )
    assert flat.prefill_size_trend == (0.0, 1.0) and flat.prefill_host_factor == pytest.approx(1.3)


def test_prefill_spread_is_drawn_per_prefill(serve_trace):
    """Each prefill costs the model x a factor drawn from the measured spread (seeded): a spread of
    only 2.0 doubles every prefill; the draws repeat with the seed."""
    from pddflow.graph import load_plan
    from pddflow.sim.serve_replay import serve_workload
    from pddflow.sim.simulator import Simulation

    plan = load_plan(str(ROOT / "graphs" / "pdd.yaml")).scaled_to_local()
    wl = serve_workload(serve_trace, 3, 2, plan.model.block_size, seed=0, rps=2.0, think_s=1.0)

    def prefills(spread: tuple[float, ...], seed: int = 0) -> list[float]:
        sim = Simulation(plan, wl, seed=seed, prefill_first_token=True, prefill_spread=spread)
        sim.run()
        return [r.t_prefill - r.t_prefill_start for r in sorted(sim.runs, key=lambda r: r.req.rid)]

    base, doubled = prefills(()), prefills((2.0,))
    assert doubled == pytest.approx([2 * x for x in base], rel=1e-9)
    assert (
        prefills((0.8, 1.0, 1.6), 3) == prefills((0.8, 1.0, 1.6), 3) != prefills((0.8, 1.0, 1.6), 4)
    )


def test_relay_handover_is_drawn_per_request(serve_trace):
    """With measured handovers the relay holds a prefill's KV that long after the prefill ends
    (instead of the RDMA model's microseconds), and shows its first token no earlier."""
    from dataclasses import replace

    from pddflow.graph import load_plan
    from pddflow.sim.serve_replay import serve_workload
    from pddflow.sim.simulator import Simulation

    plan = load_plan(str(ROOT / "graphs" / "pdd.yaml")).scaled_to_local()
    plan = replace(
        plan, links={n: replace(link, gbps=0.05) for n, link in plan.links.items()}
    )  # relay paths
    wl = serve_workload(serve_trace, 3, 2, plan.model.block_size, seed=0, rps=2.0, think_s=1.0)
    sim = Simulation(plan, wl, seed=0, prefill_first_token=True, relay_handovers=(0.25,))
    sim.run()
    relayed = [r for r in sim.runs if r.path.relay is not None and r.r_state != "none"]
    assert relayed and all(r.t_first - r.t_prefill >= 0.25 - 1e-9 for r in relayed)
    # measured after queued prefills (a busy host): those draw from them, the others from the rest
    busy = Simulation(
        plan,
        serve_workload(serve_trace, 4, 2, plan.model.block_size, seed=0, rps=1000.0, think_s=1.0),
        seed=0,
        prefill_first_token=True,
        prefill_spread=(10.0,),  # slow prefills: a queue
        relay_handovers=(0.01, 0.4),
        relay_handovers_queued=(0.4,),
    )
    busy.run()
    relayed = [r for r in busy.runs if r.path.relay is not None and r.r_state != "none"]
    queued = [r.t_prefill_start - r.arrival >= 0.05 for r in relayed]
    assert any(queued) and not all(queued)
    assert all((r.t_first - r.t_prefill >= 0.4 - 1e-9) == q for r, q in zip(relayed, queued))


def test_prefill_shipping_holds_the_prefill_engine(serve_trace):
    """With the runtime's one call at a time, a prefill worker ships each prompt's KV before it
    starts the next: no prefill starts within the drawn shipping time (per byte, times the bytes
    it sends) of the previous one's end."""
    from pddflow.graph import load_plan
    from pddflow.sim.serve_replay import serve_workload
    from pddflow.sim.simulator import Simulation

    plan = load_plan(str(ROOT / "graphs" / "pdd.yaml")).scaled_to_local()
    wl = serve_workload(serve_trace, 4, 2, plan.model.block_size, seed=0, rps=20.0, think_s=1.0)

    def prefills(shipping: tuple[float, ...]) -> list[tuple[float, float, float]]:
        sim = Simulation(
            plan,
            wl,
            seed=0,
            prefill_first_token=True,
            exclusive_jobs=True,
            prefill_shipping=shipping,
        )
        sim.run()
        return sorted((r.t_prefill_start, r.t_prefill, r.p_ship_s, r.m_bytes) for r in sim.runs)

    rate = 20e-9  # 20 ms per MB
    shipped = prefills((rate,))
    assert all(
        a[2] > 0 and a[2] >= rate * a[3] - 1e-12 for a in shipped
    )  # at least the finisher's copy
    assert all(b[0] >= a[1] + a[2] - 1e-9 for a, b in zip(shipped, shipped[1:]))
    plain = prefills(())
    assert any(
        b[0] < a[1] + s[2] for a, b, s in zip(plain, plain[1:], shipped)
    )  # they do queue back to back


def test_serve_report_without_measurements_fails_clearly(tmp_path):
    f = tmp_path / "old.json"
    f.write_text(
        json.dumps(
            {"workload": {}, "graphs": [{"graph": "graphs/pdd.yaml", "ttft_s": {"p50": 1.0}}]}
        )
    )
    with pytest.raises(CalibrationError, match="--per-request"):
        load_serve([f])
    # rows and events of the wrong shape are skipped, not a traceback
    f.write_text(
        json.dumps(
            {
                "workload": {},
                "graphs": [
                    {
                        "graph": "graphs/pdd.yaml",
                        "decode_steps": [1],
                        "per_request": [
                            1,
                            {"prompt_tokens": "x"},
                            {
                                "prompt_tokens": 5,
                                "events": [{"event": "kv_send:rdma_tensor:relay/0", "t_ms": "a"}],
                            },
                        ],
                    }
                ],
            }
        )
    )
    with pytest.raises(CalibrationError, match="--per-request"):
        load_serve([f])


def _simulate(trace: Path, *calibrations: Path | str) -> subprocess.CompletedProcess:
    """`pddflow simulate` of pdd.yaml on `trace`; Paths are --calibrate files, strings extra options."""
    args = [
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
        "--json",
        "-q",
    ]
    for c in calibrations:
        args += ["--calibrate", str(c)] if isinstance(c, Path) else [c]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)


def test_cli_serving_load_slows_the_replay(tmp_path, serve_trace):
    """With a deployment calibration the frontend and client take cores' worth of CPU at the
    replay's own token rate (replayed to a fixed point), so tokens come slower than without."""
    engine = _engine_with_grid(tmp_path)
    serve = _serve_report(
        tmp_path, {"pdd": 1.0}, {"pdd": 20.0}, decode_factor=1.0
    )  # the load alone
    plain, loaded = _simulate(serve_trace, engine), _simulate(serve_trace, engine, serve)
    assert plain.returncode == 0 and loaded.returncode == 0, plain.stderr + loaded.stderr
    a, b = json.loads(plain.stdout), json.loads(loaded.stdout)
    assert "serving_load" not in a and a["cpu_share"]["serving_cores"] == 0
    load = b["serving_load"]
    assert load["cpu_ms_per_token"] == 20.0 and load["cores"] > 0.05 and 2 <= load["replays"] <= 6
    assert b["cpu_share"]["serving_cores"] == load["cores"]
    assert b["tpot_ms"]["p50"] > a["tpot_ms"]["p50"] * 1.02


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_cli_wall_beyond_the_host_model_slows_its_steps(tmp_path, serve_trace, kind):
    """A deployment whose main decoder (prefill) measured 1.8x its CPU in wall time (its other
    threads, the relay decoding beside the prefill, the frontend on its core): the replay settles
    a factor that makes its simulated decode (prefill) wall over model time 1.8 as well, and tokens
    (first tokens) come later than with the host model alone."""
    engine = _engine_with_grid(tmp_path)
    measured = (
        {"wall_over_cpu": {"main/0": 1.8}} if kind == "decode" else {"prefill_wall_over_cpu": 1.8}
    )
    inst, figure = ("main/0", "tpot_ms") if kind == "decode" else ("prefill/0", "ttft_s")
    plain = _simulate(
        serve_trace, engine, _serve_report(tmp_path, {"pdd": 1.0}, {"pdd": 1.0}, decode_factor=1.0)
    )
    walled = _simulate(
        serve_trace,
        engine,
        _serve_report(tmp_path, {"pdd": 1.0}, {"pdd": 1.0}, decode_factor=1.0, **measured),
    )
    assert plain.returncode == 0 and walled.returncode == 0, plain.stderr + walled.stderr
    a, b = json.loads(plain.stdout), json.loads(walled.stdout)
    assert f"{kind}_wall" not in a
    w = b[f"{kind}_wall"][inst]
    assert w["measured_wall_over_cpu"] == 1.8 and w["factor"] > 1.3
    assert w["simulated_wall_over_model"] == pytest.approx(1.8, rel=0.05)
    assert b["calibration"]["deployment"][f"{kind}_wall_over_cpu"] == {inst: 1.8}
    assert b[figure]["p50"] > a[figure]["p50"] * 1.2


def test_cli_replications_report_the_median(tmp_path, serve_trace):
    engine = _engine_with_grid(tmp_path)
    out = _simulate(
        serve_trace,
        engine,
        _serve_report(tmp_path, {"pdd": 1.2}, {"pdd": 1.5}),
        "--replications",
        "3",
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    reps = d["replications"]
    assert reps["n"] == 3 and len(reps["ttft_s_p90"]) == 3
    assert d["ttft_s"]["p90"] == pytest.approx(sorted(reps["ttft_s_p90"])[1], abs=1e-4)


def test_cli_serve_report_alone_is_refused(tmp_path, serve_trace):
    out = _simulate(serve_trace, _serve_report(tmp_path, {"pdd": 1.0}, {"pdd": 1.0}))
    assert out.returncode == 2 and "bench engine" in out.stderr and "Traceback" not in out.stderr


def test_cli_serve_report_needs_the_serve_workload(tmp_path):
    serve = _serve_report(tmp_path, {"pdd": 1.0}, {"pdd": 1.0})
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pddflow.cli",
            "simulate",
            str(ROOT / "graphs" / "pdd.yaml"),
            "-n",
            "50",
            "--calibrate",
            str(_engine_with_grid(tmp_path)),
            "--calibrate",
            str(serve),
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert (
        out.returncode == 2 and "--serve-workload" in out.stderr and "Traceback" not in out.stderr
    )
