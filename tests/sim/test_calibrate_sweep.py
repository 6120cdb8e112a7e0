"""Calibration from `pddflow bench engine --json` output, and the hit-rate sweep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pddflow.graph import load_plan
from pddflow.sim.agentic import AgenticConfig
from pddflow.sim.calibration import CalibrationError, calibrated_plan
from pddflow.sim.calibration.bench_files import load_bench, merge
from pddflow.sim.calibration.engine_fit import fit
from pddflow.sim.sweep import hit_rate_sweep

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "doc",
    [
        {
            "prefill": {"tokens_per_s": 2000, "prompt_tokens": 256},
            "decode": {"tokens_per_s": 150, "batch": 4},
        },
        {
            "prefill_tokens_per_s": 2000,
            "decode_tokens_per_s": 150,
            "decode_batch": 4,
            "prefill_prompt_tokens": 256,
        },
        {
            "results": [
                {
                    "phase": "x",
                    "prefill": {"throughput_tok_s": 2000, "input_tokens": 256},
                    "decode": {"throughput_tok_s": 150, "batch_size": 4},
                }
            ]
        },
    ],
)
def test_fit_reproduces_the_measured_rates(tmp_path, doc):
    f = tmp_path / "bench.json"
    f.write_text(json.dumps(doc))
    cal = fit(load_bench(f))
    assert cal.arch.name == "tiny-llama"
    m = cal.model()
    assert m.prefill_tokens_per_s(256) == pytest.approx(2000, rel=1e-6)
    assert m.decode_tokens_per_s(4, 256) == pytest.approx(150, rel=1e-6)
    plan = calibrated_plan(load_plan(str(ROOT / "graphs" / "pdd.yaml")), cal)
    assert plan.profile == "local" and len(plan.instances) == 3
    assert all(d.tflops == cal.device.tflops for d in plan.device_classes.values())


@pytest.mark.slow
def test_cli_calibrated_agentic_run_on_the_local_profile(tmp_path):
    """docs/simulator.md's quick start: an engine benchmark alone, the agentic workload, no host
    model: the local profile with the deployment's KV memory per worker, and a result."""
    f = tmp_path / "engine.json"
    f.write_text(
        json.dumps(
            {
                "model": "builtin:tiny-llama",
                "threads": 1,
                "prefill": {"64": {"engine_tok_s": 1300.0}, "128": {"engine_tok_s": 1200.0}},
                "decode": {
                    "context": 32,
                    "1": {"engine_tok_s": 60.0},
                    "4": {"engine_tok_s": 230.0},
                },
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
            "--calibrate",
            str(f),
            "--prompt-tokens",
            "400",
            "--output-tokens",
            "32",
            "--rps",
            "1",
            "-n",
            "40",
            "--json",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["completed"] == 40 and "decode_wall" not in d
    assert d["calibration"]["deployment"] is None
    plan = calibrated_plan(load_plan(str(ROOT / "graphs" / "pdd.yaml")), fit(load_bench(f)))
    assert {op.kv_budget_bytes for op in plan.operators.values()} == {float(256 << 20)}


def test_engine_bench_layout(tmp_path):
    """What `pddflow bench engine --json` writes: prefill keyed by prompt length, decode by
    batch."""
    doc = {
        "model": "builtin:tiny-llama",
        "device": "cpu",
        "prefill": {
            "128": {"engine_tok_s": 900.0, "hf_tok_s": 800.0},
            "512": {"engine_tok_s": 2000.0},
        },
        "decode": {
            "context": 256,
            "1": {"engine_tok_s": 60.0, "engine_step_ms": 16.7},
            "8": {"engine_tok_s": 300.0},
        },
        "extend": {"tokens": 32},
        "mixed": {"engine_tok_s": 100.0},
    }
    f = tmp_path / "engine.json"
    f.write_text(json.dumps(doc))
    facts = load_bench(f)
    assert (
        facts.prompt_tokens,
        facts.prefill_tokens_per_s,
        facts.decode_batch,
        facts.decode_context,
    ) == (512, 2000, 1, 256)
    cal = fit(facts)
    m = cal.model()
    assert m.prefill_tokens_per_s(512) == pytest.approx(2000, rel=1e-6)
    assert m.decode_tokens_per_s(1, 256) == pytest.approx(60, rel=1e-6)
    checks = cal.to_dict()
    assert set(checks["decode_check"]) == {"1", "8"}
    assert set(checks["prefill_check"]) == {"128", "512"}


def test_long_context_decode_point_fits_the_kv_read_cost(tmp_path):
    """`decode_long` (the engine at its largest batch over a long context) fixes how a step grows
    with the KV it reads; the short points still fit exactly."""
    doc = {
        "model": "builtin:tiny-llama",
        "prefill": {"64": {"engine_tok_s": 800.0}, "128": {"engine_tok_s": 1000.0}},
        "decode": {"context": 32, "1": {"engine_tok_s": 50.0}, "4": {"engine_tok_s": 170.0}},
        "decode_long": {"context": 768, "batch": 4, "engine_step_ms": 60.0},
    }
    f = tmp_path / "engine.json"
    f.write_text(json.dumps(doc))
    cal = fit(load_bench(f))
    m = cal.model()
    assert m.decode_step_s(4, 4 * 768) == pytest.approx(0.060, rel=1e-6)
    # the KV term moves the short
    assert m.decode_tokens_per_s(1, 32) == pytest.approx(50, rel=0.03)
    assert m.decode_tokens_per_s(4, 32) == pytest.approx(170, rel=0.05)  # points a little
    assert (
        cal.efficiency.kv_read_factor > 1
        and cal.to_dict()["decode_long_check"]["measured_step_ms"] == 60.0
    )
    del doc["decode_long"]
    f.write_text(json.dumps(doc))
    assert fit(load_bench(f)).efficiency.kv_read_factor == 1.0


def test_long_extend_point_fits_the_attention_cost(tmp_path):
    """`extend_long` (new tokens over a long cached context) fixes what attention costs against the
    matmuls; the prefill points and the long point are all reproduced."""
    doc = {
        "model": "builtin:tiny-llama",
        "prefill": {"64": {"engine_tok_s": 800.0}, "128": {"engine_tok_s": 1000.0}},
        "decode": {"context": 32, "1": {"engine_tok_s": 50.0}, "4": {"engine_tok_s": 170.0}},
        "extend": {"tokens": 16, "context": 48, "extend_ms": 25.0},
        "extend_long": {"tokens": 128, "context": 768, "extend_ms": 200.0},
    }
    f = tmp_path / "engine.json"
    f.write_text(json.dumps(doc))
    cal = fit(load_bench(f))
    m = cal.model()
    assert cal.efficiency.attn_factor > 1.5
    assert m.prefill_tokens_per_s(128) == pytest.approx(1000, rel=1e-3)
    assert m.prefill_tokens_per_s(64) == pytest.approx(800, rel=1e-3)
    assert cal.to_dict()["extend_long_check"]["model_ms"] == pytest.approx(200.0, rel=0.02)
    del doc["extend_long"]
    f.write_text(json.dumps(doc))
    assert fit(load_bench(f)).efficiency.attn_factor == 1.0


def test_missing_keys_fail_clearly(tmp_path):
    f = tmp_path / "bench.json"
    f.write_text(json.dumps({"prefill": {"tokens_per_s": 10}}))
    with pytest.raises(
        CalibrationError,
        match=r"bench.json: no decode throughput found; expected .*decode.tokens_per_s",
    ):
        load_bench(f)
    f.write_text("not json")
    with pytest.raises(CalibrationError, match="not JSON"):
        load_bench(f)


@pytest.mark.slow
def test_cli_bad_calibration_fails_without_traceback(tmp_path):
    f = tmp_path / "bench.json"
    f.write_text("not json")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pddflow.cli",
            "simulate",
            str(ROOT / "graphs" / "pdd.yaml"),
            "--calibrate",
            str(f),
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and "error:" in out.stderr and "Traceback" not in out.stderr


def test_fixed_load_sweep_rows():
    plan = load_plan(str(ROOT / "graphs" / "sim" / "same_dc_pd_88.yaml"))
    rows = hit_rate_sweep(
        plan,
        AgenticConfig(requests=300, rps=6),
        hits=(0.0, 0.9),
        cached_ratios=(0.1, 0.25),
        load="fixed",
    )
    assert [r["target_hit"] for r in rows] == [0.0, 0.9]
    assert rows[0]["workload_hit"] < 0.05 < 0.8 < rows[1]["workload_hit"]
    for r in rows:  # cheaper cached tokens never earn more
        assert r["usd_per_gpu_hour@0.1"] <= r["usd_per_gpu_hour@0.25"]
    assert rows[0]["usd_per_gpu_hour@0.1"] == pytest.approx(
        rows[0]["usd_per_gpu_hour@0.25"], rel=0.05
    )


def test_tiny_llama_preset_is_the_builtin_model():
    """The calibration fits the built-in model with the tiny-llama preset: its numbers must be that
    model's, or the fitted split between weights, KV and attention is wrong (it was: 30M params,
    8 KV heads, attention 8x the KV bytes)."""
    from pddflow.core.arch import ARCHS
    from pddflow.core.model_config import TINY_LLAMA as c

    a = ARCHS.get("tiny-llama")
    assert a.kv_bytes_per_token == c.kv_bytes_per_token(4)
    assert a.weight_bytes == pytest.approx(c.num_params() * 4, rel=1e-3)
    # the input embedding is a lookup
    assert a.flops_per_token == pytest.approx(2 * c.num_params(), rel=1e-2)
    assert a.attention_flops_per_pair == 4 * c.num_layers * c.num_heads * c.head_dim


def test_several_calibrations_merge_to_the_median_of_each_point(tmp_path):
    def doc(pre: float, dec: float, corun: float | None = None) -> Path:
        d = {
            "model": "builtin:tiny-llama",
            "threads": 1,
            "prefill": {"64": {"engine_tok_s": pre * 0.8}, "128": {"engine_tok_s": pre}},
            "decode": {"context": 32, "1": {"engine_tok_s": dec}, "4": {"engine_tok_s": dec * 3.5}},
            "decode_long": {"context": 768, "batch": 4, "engine_step_ms": 6000 / dec},
        }
        if corun:
            d["corun"] = {"prefill_factor": corun, "decode_factor": corun}
        f = tmp_path / f"e{pre}_{dec}.json"
        f.write_text(json.dumps(d))
        return f

    facts = merge(
        [load_bench(doc(1000, 40, 1.1)), load_bench(doc(1200, 60)), load_bench(doc(900, 50, 1.3))]
    )
    assert facts.prefill_tokens_per_s == 1000 and dict(facts.prefill_points)[64] == 800
    assert facts.decode_tokens_per_s == 50 and dict(facts.decode_points)[4] == 175
    assert facts.decode_long == (4, 768, pytest.approx(6000 / 50 / 1e3))
    assert facts.corun == pytest.approx((1.2, 1.2))  # only the two that measured it
    one = load_bench(doc(1000, 40))
    assert merge([one]) is one
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps(
            {
                "model": "builtin:tiny-llama",
                "threads": 2,
                "prefill": {"128": {"engine_tok_s": 900}},
                "decode": {"context": 32, "1": {"engine_tok_s": 40}},
            }
        )
    )
    with pytest.raises(CalibrationError, match="different setup"):
        merge([one, load_bench(other)])
