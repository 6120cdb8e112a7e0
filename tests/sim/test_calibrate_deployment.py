"""Calibration beyond two prefill lengths: the prefill grid of `pddflow bench engine`, and the
deployment's own facts from a `pddflow bench serve --json --per-request` report, measured against
the engine fit. The fixtures come from known step costs (`_prefill_truth_ms`, `_decode_truth_s`),
never from the code under test, so a wrong fit or a wrong deployment model fails."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from pddflow.core.arch import ARCHS
from pddflow.sim.calibration import CalibrationError, HostSpec, Measurements, is_serve_report
from pddflow.sim.calibration.bench_files import load_bench
from pddflow.sim.calibration.engine_fit import fit
from pddflow.sim.calibration.serve_report import load_serve

ROOT = Path(__file__).resolve().parents[2]
ARCH = ARCHS.get("tiny-llama")
SPREAD = (1.0, 0.8, 1.5, 1.0, 0.9, 1.2)  # median 1
DECODE_FACTOR = 1.6  # the reports' decode steps over the engine's
ENGINE = {
    "model": "builtin:tiny-llama",
    "threads": 1,
    "prefill": {"64": {"engine_tok_s": 1300.0}, "128": {"engine_tok_s": 1200.0}},
    "decode": {"context": 32, "1": {"engine_tok_s": 60.0}, "4": {"engine_tok_s": 230.0}},
    "extend": {"tokens": 16, "context": 48, "extend_ms": 25.0},
}


def _prefill_truth_ms(new: int, cached: int) -> float:
    """The engine's prefill: 12 ms fixed, 0.15 TFLOP/s, attention at 4x its FLOPs."""
    pairs = new * cached + new * new / 2
    flops = new * ARCH.flops_per_token + pairs * ARCH.attention_flops_per_pair * 4.0
    return 12.0 + flops / 0.15e12 * 1e3


def _decode_truth_s(steps: int, seqs: int, context_tokens: int) -> float:
    """The engine's decode steps: the weights read once a step and every sequence's KV at
    15 GB/s, plus 2 ms per sequence."""
    read = steps * ARCH.weight_bytes + context_tokens * ARCH.kv_bytes_per_token
    return read / 15e9 + seqs * 0.002


def _engine_with_grid(tmp_path: Path) -> Path:
    doc = dict(ENGINE)
    doc["prefill"] = {
        str(n): {"engine_tok_s": n / _prefill_truth_ms(n, 0) * 1e3} for n in (64, 128)
    }
    doc["decode"] = {
        "context": 32,
        **{str(b): {"engine_tok_s": b / _decode_truth_s(1, b, 32 * b)} for b in (1, 4)},
    }
    shapes = [(32, 0), (256, 0), (512, 0), (32, 256), (128, 256), (256, 256), (32, 768)]
    doc["prefill_grid"] = {
        "statistic": "median of 3",
        "points": [
            {"tokens": n, "cached": c, "prefill_ms": _prefill_truth_ms(n, c)}
            for n, c in shapes + [(128, 768), (256, 768)]
        ],
    }
    f = tmp_path / "engine.json"
    f.write_text(json.dumps(doc))
    return f


def test_prefill_grid_fits_fixed_cost_rate_and_attention(tmp_path):
    """Two cold lengths cannot tell a fixed cost from attention; the grid over cached prefixes can,
    and the fit then reproduces prompts it never measured."""
    engine = fit(load_bench(_engine_with_grid(tmp_path)))
    m = engine.model()
    assert engine.efficiency.prefill_overhead_s == pytest.approx(0.012, rel=1e-3)
    assert engine.efficiency.attn_factor == pytest.approx(4.0, rel=1e-3)
    for new, cached in ((31, 208), (150, 600), (400, 100)):
        assert m.prefill_s(new, cached) * 1e3 == pytest.approx(
            _prefill_truth_ms(new, cached), rel=1e-3
        )
    check = engine.to_dict()["prefill_grid_check"]
    assert len(check) == 9 and all(
        c["model_ms"] == pytest.approx(c["measured_ms"], rel=1e-3) for c in check
    )
    # the two decode batch sizes split the step into memory traffic and a per-sequence cost
    for b, ctx in ((1, 32), (8, 500)):
        assert m.decode_step_s(b, b * ctx) == pytest.approx(_decode_truth_s(1, b, b * ctx))


def test_without_a_grid_the_exact_fits_remain(tmp_path):
    f = tmp_path / "engine.json"
    f.write_text(json.dumps(ENGINE))
    engine = fit(load_bench(f))
    assert engine.model().prefill_tokens_per_s(128) == pytest.approx(1200, rel=1e-6)
    assert engine.to_dict()["prefill_grid_check"] == []
    assert Measurements.load([f]).report("graphs/pdd.yaml")["deployment"] is None


PREFILLS = [(211, 0), (360, 208), (497, 352), (72, 16), (635, 496), (239, 208)]


def _serve_report(
    tmp_path: Path,
    factors: dict[str, float],
    decode_factor: float = DECODE_FACTOR,
    wall_over_cpu: dict[str, float] | None = None,
    prefill_wall_over_cpu: float | None = None,
) -> Path:
    """A `bench serve --json --per-request` report whose prefills took `factor` x the engine's,
    spread around it as SPREAD, and 1.3x their CPU in wall time (`prefill_wall_over_cpu`: that
    ratio, and the sends name their instance, as the runtime's do)."""
    graphs = []
    for name, factor in factors.items():
        rows = []
        for i, (prompt, cached) in enumerate(PREFILLS):
            cpu_ms = _prefill_truth_ms(prompt - cached, cached) * factor * SPREAD[i]
            wall_ms = cpu_ms * (prefill_wall_over_cpu or 1.3)
            end = 3.0 + wall_ms
            send = {
                "t_ms": end + 2.0,  # the prefill's end, then a 2 ms export
                "prefill_cpu_ms": cpu_ms,
                "cached_tokens": cached,
                "prefill_ms": wall_ms,
                "export_ms": 2.0,
                "bytes": 4e6,
            }
            if prefill_wall_over_cpu is not None:
                send["instance"] = "prefill/0"
            # main's copy, exported after the relay's: the worker busy 7 + i ms for 5 MB
            wan = {**send, "t_ms": end + 7.0 + i, "export_ms": 5.0 + i, "bytes": 1e6}
            rows.append(
                {
                    "session": i,
                    "turn": 0,
                    "prompt_tokens": prompt,
                    "events": [
                        {"event": "arrival", "t_ms": 0.0},
                        {"event": "kv_send", "channel": "rdma_tensor", "peer": "relay/0", **send},
                        {"event": "kv_send", "channel": "wan_flight", "peer": "main/0", **wan},
                    ],
                }
            )
        decode = {}
        for inst, (steps, seqs, ctx) in {
            "relay/0": (100, 150, 60_000),
            "main/0": (400, 1600, 800_000),
        }.items():
            cpu_s = _decode_truth_s(steps, seqs, ctx) * decode_factor
            decode[inst] = {"steps": steps, "cpu_s": cpu_s, "seqs": seqs, "context_tokens": ctx}
            if wall_over_cpu and inst in wall_over_cpu:
                decode[inst]["wall_s"] = cpu_s * wall_over_cpu[inst]
        graphs.append(
            {
                "graph": f"graphs/{name}.yaml",
                "per_request": rows,
                "decode_steps": decode,
            }
        )
    f = tmp_path / "serve.json"
    f.write_text(json.dumps({"workload": {"sessions": 6}, "graphs": graphs}))
    return f


def test_deployment_calibration_per_graph(tmp_path):
    """Each graph takes its own deployment's prefill factor; a graph the report did not serve
    takes every graph's prefills pooled; prefill-like costs scale by the prefill factor, decode
    steps by the decode factor."""
    serve = _serve_report(tmp_path, {"pdd": 1.3, "cross_dc_pd": 1.1})
    engine_file = _engine_with_grid(tmp_path)
    assert is_serve_report(serve) and not is_serve_report(engine_file)
    measured = Measurements.load([engine_file], [serve])
    dep = measured.deployment("graphs/pdd.yaml")
    assert dep.prefill_host_factor == pytest.approx(1.3, rel=1e-3)
    assert dep.decode_host_factor == pytest.approx(DECODE_FACTOR, rel=1e-3)
    cal = measured.calibration("graphs/pdd.yaml", HostSpec(2))
    m = cal.device_model(measured.engine.device, 1, measured.engine.arch)
    assert m.prefill_s(150, 300) * 1e3 == pytest.approx(1.3 * _prefill_truth_ms(150, 300), rel=1e-3)
    assert m.decode_step_s(4, 2000) == pytest.approx(
        DECODE_FACTOR * _decode_truth_s(1, 4, 2000), rel=1e-3
    )
    other = measured.deployment("graphs/same_dc_pd.yaml")
    assert 1.1 < other.prefill_host_factor < 1.3
    d = measured.report("graphs/pdd.yaml")["deployment"]
    assert d["prefills"] == 6 and d["prefill_host_factor"] == pytest.approx(1.3, rel=1e-3)
    assert d["decode_steps"] == 500
    assert dep.prefill_spread == pytest.approx(sorted(SPREAD), rel=1e-3)
    # prefill end -> its last KV copy exported: 7, 8, ... 12 ms for 5 MB, per byte
    assert cal.prefill_shipping == pytest.approx([(0.007 + 0.001 * i) / 5e6 for i in range(6)])
    q = d["prefill_shipping_ms_per_mb"]
    assert 1.4 <= q[0.1] < q[0.5] < q[0.9] <= 2.4
    assert cal.prefill_wall_over_cpu == {} and d["prefill_wall_over_cpu"] is None  # no instance
    walled = Measurements.load(
        [engine_file],
        [_serve_report(tmp_path, {"pdd": 1.3}, prefill_wall_over_cpu=1.45)],
    )
    assert walled.calibration("graphs/pdd.yaml", HostSpec(2)).prefill_wall_over_cpu == (
        pytest.approx({"prefill/0": 1.45})
    )
    assert walled.report("graphs/pdd.yaml")["deployment"]["prefill_wall_over_cpu"] == {
        "prefill/0": 1.45
    }


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
    bad_rows = [
        1,
        {"prompt_tokens": "x"},
        {"prompt_tokens": 5, "events": [{"event": "kv_send", "peer": "relay/0", "t_ms": "a"}]},
    ]
    f.write_text(
        json.dumps(
            {
                "workload": {},
                "graphs": [
                    {"graph": "graphs/pdd.yaml", "decode_steps": [1], "per_request": bad_rows}
                ],
            }
        )
    )
    with pytest.raises(CalibrationError, match="--per-request"):
        load_serve([f])


def _simulate(trace: Path, *calibrations: Path | str) -> subprocess.CompletedProcess:
    """`pddflow simulate` of pdd.yaml on `trace`; Paths are --calibrate files, strings extra
    options."""
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


@pytest.mark.slow
def test_cli_prefill_wall_beyond_the_host_model_slows_its_prefills(tmp_path, serve_trace):
    """A deployment whose prefill measured 1.8x its CPU in wall time: the replay settles a factor
    that makes its simulated prefill wall over model time 1.8 as well, and prefills take longer
    than with the host model alone. (Prefill, not TTFT: the SLA rule sees the slower prefill and
    sends more requests through the relay.) A decoder's wall over CPU is no term (measured
    2026-12-07: the replay was closer without it) and changes nothing."""
    engine = _engine_with_grid(tmp_path)
    plain = _simulate(
        serve_trace,
        engine,
        _serve_report(tmp_path, {"pdd": 1.0}, decode_factor=1.0),
        "--per-request",
    )
    walled = _simulate(
        serve_trace,
        engine,
        _serve_report(
            tmp_path,
            {"pdd": 1.0},
            decode_factor=1.0,
            wall_over_cpu={"main/0": 1.8},
            prefill_wall_over_cpu=1.8,
        ),
        "--per-request",
    )
    assert plain.returncode == 0 and walled.returncode == 0, plain.stderr + walled.stderr
    a, b = json.loads(plain.stdout), json.loads(walled.stdout)
    assert "prefill_wall" not in a and "decode_wall" not in b
    w = b["prefill_wall"]["prefill/0"]
    assert w["measured_wall_over_cpu"] == 1.8 and w["factor"] > 1.3
    assert w["simulated_wall_over_model"] == pytest.approx(1.8, rel=0.05)
    deployment = b["calibration"]["deployment"]
    assert deployment["prefill_wall_over_cpu"] == {"prefill/0": 1.8}
    assert "decode_wall_over_cpu" not in deployment
    prefill_s = [statistics.median(r["prefill_s"] for r in x["per_request"]) for x in (a, b)]
    assert prefill_s[1] > prefill_s[0] * 1.2


@pytest.mark.slow
def test_cli_replications_report_the_median(tmp_path, serve_trace):
    engine = _engine_with_grid(tmp_path)
    serve = _serve_report(tmp_path, {"pdd": 1.2})
    out = _simulate(serve_trace, engine, serve, "--replications", "3")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    reps = d["replications"]
    assert reps["n"] == 3 and len(reps["ttft_s_p90"]) == 3
    assert d["ttft_s"]["p90"] == pytest.approx(sorted(reps["ttft_s_p90"])[1], abs=1e-4)


@pytest.mark.slow
def test_cli_serve_report_alone_is_refused(tmp_path, serve_trace):
    out = _simulate(serve_trace, _serve_report(tmp_path, {"pdd": 1.0}))
    assert out.returncode == 2 and "bench engine" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_cli_serve_report_needs_the_serve_workload(tmp_path):
    serve = _serve_report(tmp_path, {"pdd": 1.0})
    args = [sys.executable, "-m", "pddflow.cli", "simulate", str(ROOT / "graphs" / "pdd.yaml")]
    args += ["-n", "50", "--calibrate", str(_engine_with_grid(tmp_path)), "--calibrate"]
    out = subprocess.run(
        args + [str(serve), "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 2 and "--serve-workload" in out.stderr
    assert "Traceback" not in out.stderr
