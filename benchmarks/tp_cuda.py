"""The engine's tensor parallelism on a CUDA machine in one go (NCCL for the partial sums and KV,
gloo for the step messages): tiny random Llama and Qwen3 checkpoints with 2, 4 and 8 KV heads at
TP 1, 2 and 4 (as many as the devices allow; TP 4 over 2 KV heads included), every rank a process
on its own GPU, in fp32. Per checkpoint and degree: the largest logit difference to transformers
(fp32 on the CPU) and to TP 1 on CUDA, greedy tokens against transformers and TP 1, the KV export
against TP 1's, and TP 1's export imported and continued at TP N. Then the step times of
builtin:tiny-llama at each degree (`pddflow bench engine`'s tensor-parallel section, on CUDA), and
a deployment of graphs/pdd.yaml with prefill at TP 2 and relay and main at TP 1 (the local
backend: rank r of an instance on GPU r): the greedy tokens of p_md, one-shot and catch-up against
`generate` at TP 1.

    python benchmarks/tp_cuda.py [--degrees 1,2,4] [--tol 1e-4] [--no-timing] [--no-deploy]
        [--json] [--device cpu]

Needs the dev extra (transformers) and CUDA devices; exits 2 without CUDA (`--device cpu` runs the
same flow on the CPU over gloo: a dry run of the script, not of NCCL). Prints JSON (--json) or
a summary; exits 1 when a check fails. Nothing is downloaded: the checkpoints are written here.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from pddflow.operators.engine import Engine
from pddflow.operators.weights import load_model_source
from pddflow.testing.tiny_checkpoints import tiny_llama, tiny_qwen3
from pddflow.testing.tp_harness import CONFIG, CONTINUATION, PROMPT, run_harness, run_scenarios

NAMES = [f"{arch}-kv{kv}" for arch in ("llama", "qwen3") for kv in (2, 4, 8)]


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float().cpu() - b.float().cpu()).abs().max())


def hf_reference(path: str) -> dict:
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = hf(torch.tensor([PROMPT])).logits[0]
        gen = hf.generate(
            torch.tensor([PROMPT]),
            max_new_tokens=CONTINUATION,
            min_new_tokens=CONTINUATION,
            do_sample=False,
            pad_token_id=0,
        )
    return {"logits": logits, "greedy": gen[0, len(PROMPT) :].tolist()}


def compare(got: dict, tp1: dict, hf: dict, tol: float) -> dict:
    row = {
        "logits_vs_hf": _diff(got["score"], hf["logits"]),
        "logits_vs_tp1": _diff(got["score"], tp1["score"]),
        "greedy_equals_hf": got["continuation"] == hf["greedy"],
        "batch_tokens_equal_tp1": got["batch_tokens"] == tp1["batch_tokens"]
        and got["steps_tokens"] == tp1["steps_tokens"],
        "radix_hit_tokens": got["radix_hit_tokens"],
        "sampled_logits_vs_tp1": max(
            _diff(got[part][k], tp1[part][k])
            for part in ("batch_logits", "steps_logits")
            for k in tp1[part]
        ),
        "export_vs_tp1": _diff(got["export"]["data"], tp1["export"]["data"]),
    }
    imp = got["imports"].get("1")
    if imp is not None:
        row["import_from_tp1_continues"] = imp["tokens"] == tp1["continuation"]
    row["ok"] = (
        row["logits_vs_hf"] < tol
        and row["logits_vs_tp1"] < tol
        and row["sampled_logits_vs_tp1"] < tol
        and row["export_vs_tp1"] < tol
        and row["greedy_equals_hf"]
        and row["batch_tokens_equal_tp1"]
        and row.get("import_from_tp1_continues", True)
    )
    return row


def deploy_check(max_tokens: int = 16) -> dict:
    """graphs/pdd.yaml deployed with prefill at TP 2, relay and main at TP 1: every route's greedy
    tokens against `generate` at TP 1 (builtin:tiny-llama)."""
    from pddflow.bench.deploy_process import DeployProcess, post_json
    from pddflow.core.payloads import SamplingParams

    root = Path(__file__).resolve().parents[1]
    eng = Engine(load_model_source("builtin:tiny-llama"))
    prompt = "The relay decodes while the KV crosses the WAN."
    ids = eng.tokenizer.encode(prompt)
    stops = tuple(eng.tokenizer.eos_token_ids)
    want = eng.generate([ids], SamplingParams(max_tokens=max_tokens, stop_token_ids=stops))
    want_ids = want[0].output_ids
    text = (root / "graphs" / "pdd.yaml").read_text()
    one = "devices_per_replica: {prefill: 1, relay: 1, main: 1}"
    routes = {"p_md": None, "one_shot": "one_shot", "catch_up": "catch_up"}
    with tempfile.TemporaryDirectory(prefix="pddflow-tp-deploy-") as tmp:
        graph = Path(tmp) / "pdd_tp.yaml"
        graph.write_text(text.replace(one, "devices_per_replica: {prefill: 2, relay: 1, main: 1}"))
        dep = DeployProcess(graph, Path(tmp) / "run", startup_s=600)
        got = {}
        try:
            for name, handoff in routes.items():
                body = {
                    "model": "pdd",
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "return_token_ids": True,
                    "variant": "p_md" if handoff is None else "p_rld_md",
                    "handoff": handoff,
                }
                code, res = post_json(f"{dep.base}/v1/completions", body, timeout=120)
                got[name] = res["choices"][0]["token_ids"] if code == 200 else res
            ranks = dep.health()["workers"]["prefill/0"]["ranks"]
        finally:
            dep.stop()
    return {
        "prefill_ranks": ranks,
        "exact": {name: ids == want_ids for name, ids in got.items()},
        "ok": all(ids == want_ids for ids in got.values()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--degrees", default="1,2,4")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-deploy", action="store_true", help="skip the deployment check")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = ap.parse_args()
    degrees = [int(d) for d in args.degrees.split(",")]
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("error: no CUDA device here; this script checks the NCCL path", file=sys.stderr)
        return 2
    count = torch.cuda.device_count() if cuda else max(degrees)
    out: dict = {
        "devices": [torch.cuda.get_device_name(i) for i in range(count)] if cuda else ["cpu"],
        "torch": torch.__version__,
        "tolerance": args.tol,
        "checks": {},
        "skipped": {str(d): f"needs {d} devices, {count} here" for d in degrees if d > count},
    }
    degrees = [d for d in degrees if d <= count and d > 1]
    config = replace(CONFIG, device="cuda", dtype="float32") if cuda else CONFIG
    with tempfile.TemporaryDirectory(prefix="pddflow-tp-cuda-") as tmp:
        models = []
        for i, name in enumerate(NAMES):
            arch, kv = name.split("-kv")
            make = tiny_llama if arch == "llama" else tiny_qwen3
            models.append(
                (name, str(make(Path(tmp) / name, seed=20 + i, heads=8, kv_heads=int(kv))))
            )
        hf = {name: hf_reference(path) for name, path in models}
        tp1 = {
            name: run_scenarios(Engine(load_model_source(path), config)) for name, path in models
        }
        runs = {1: tp1}
        for d in degrees:
            runs[d] = run_harness(
                d, models, {n: {"1": tp1[n]["export"]} for n, _ in models}, device=args.device
            )
        for d, res in runs.items():
            out["checks"][str(d)] = {n: compare(res[n], tp1[n], hf[n], args.tol) for n, _ in models}
    if not args.no_timing:
        from pddflow.bench.engine_tp import measure_tp

        source = load_model_source("builtin:tiny-llama")
        rng = random.Random(0)
        out["timing"] = measure_tp(
            "builtin:tiny-llama",
            source,
            tuple([1, *degrees]),
            lambda n: [rng.randrange(256) for _ in range(n)],
            prefill_tokens=2048 if cuda else 128,
            decode_batch=32 if cuda else 4,
            decode_context=512 if cuda else 32,
            decode_steps=32 if cuda else 4,
            repeats=3 if cuda else 1,
        )
    if not args.no_deploy and count >= 2:
        out["deploy"] = deploy_check()
    ok = all(r["ok"] for per in out["checks"].values() for r in per.values())
    ok = ok and out.get("deploy", {}).get("ok", True)
    out["ok"] = ok
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for d, per in out["checks"].items():
            worst = max(max(r["logits_vs_hf"], r["logits_vs_tp1"]) for r in per.values())
            bad = [n for n, r in per.items() if not r["ok"]]
            print(f"TP {d}: worst logit difference {worst:.2e}; failing: {bad or 'none'}")
        for d, why in out["skipped"].items():
            print(f"TP {d}: skipped ({why})")
        if "timing" in out:
            print(json.dumps(out["timing"]["degrees"], indent=1))
        if "deploy" in out:
            print(f"deploy prefill TP 2 / relay TP 1 / main TP 1: {json.dumps(out['deploy'])}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
