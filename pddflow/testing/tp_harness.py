"""The tensor-parallel checks' workload, run at any TP degree: the tests and benchmarks/tp_cuda.py
run `run_scenarios` on a TP 1 engine in their own process and, through this module's entry point,
on the leader of a TP N instance whose every rank is a process of it:

    python -m pddflow.testing.tp_harness --rank R --size N --init HOST:PORT --models JSON
        --out FILE [--imports FILE] [--device DEV] [--timeout S] [--hold] [--expert-parallel]

All ranks walk the same list of checkpoints; for each, rank 0 runs the scenarios and closes the
engine, the others follow it. Rank 0 writes {name: results} with torch.save. `--hold`: rank 0
builds the first engine, prints "ready" and sleeps (a leader to kill in a test).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from pddflow.core.child_python import python_module
from pddflow.core.payloads import KVBlocks, Request, SamplingParams
from pddflow.core.ports import free_port
from pddflow.operators.engine import Engine, EngineConfig
from pddflow.operators.engine_config import rank_device
from pddflow.operators.tensor_parallel import TPConfig, join
from pddflow.operators.weights import load_model_source

# block size 4 and chunks of 16: many blocks, several chunks and radix hits on short prompts
CONFIG = EngineConfig(block_size=4, attention_tile=16, chunk_size=16, kv_cache_bytes=4 * 2**20)
PROMPT = [
    int(t)
    for t in "1 17 99 3 150 42 8 8 200 5 61 77 13 190 4 33 120 9 56 71 2 140 35 88 101 6 19 170 "
    "24 66 91 12 180 45 7".split()
]
# a batch of prompts, later ones sharing earlier ones' prefixes (radix hits), lengths 9-44
BATCH = [PROMPT[:21], PROMPT[5:14], PROMPT, PROMPT[:13] + [3, 4, 5], PROMPT + PROMPT[:9]]
CONTINUATION = 8  # tokens decoded after the exported prompt


class _Recorder:
    """Every logits row the engine samples from, by sequence id (wraps engine._sample_rows)."""

    def __init__(self, engine: Engine):
        self.rows: dict[str, list[torch.Tensor]] = {}
        sample = engine._sample_rows

        def recording(seqs, logits):
            for s, row in zip(seqs, logits):
                self.rows.setdefault(s.seq_id, []).append(row.detach().float().cpu().clone())
            return sample(seqs, logits)

        engine._sample_rows = recording  # type: ignore[method-assign]

    def take(self) -> dict[str, torch.Tensor]:
        out = {k: torch.stack(v) for k, v in self.rows.items()}
        self.rows = {}
        return out


def kv_record(kv: KVBlocks) -> dict[str, Any]:
    return {
        "seq_id": kv.seq_id,
        "hashes": list(kv.block_hashes),
        "token_start": kv.token_start,
        "token_end": kv.token_end,
        "block_size": kv.block_size,
        "data": torch.as_tensor(kv.data).detach().float().cpu().clone(),
    }


def run_scenarios(engine: Engine, imports: dict[str, dict] | None = None) -> dict[str, Any]:
    """Chunked prefill, continuous batching with radix hits, extends mixed with decodes, KV
    export, and the continuation of KV exported by other engines (`imports`: name -> the
    "export" record of another run). Tensors on the CPU, for torch.save."""
    rec = _Recorder(engine)
    hits: list[int] = []
    reuse = engine.reuse_prefix

    def counting(seq, keep_last=True):
        got = reuse(seq, keep_last)
        hits.append(got)
        return got

    engine.reuse_prefix = counting  # type: ignore[method-assign]
    out: dict[str, Any] = {"score": engine.score(PROMPT).float().cpu()}  # chunks of 16

    reqs = [Request(f"g{i}", p, SamplingParams(max_tokens=10)) for i, p in enumerate(BATCH)]
    seqs = engine.generate(reqs, max_batch=3)
    out["batch_tokens"] = {s.seq_id: s.output_ids for s in seqs}
    out["batch_logits"] = rec.take()
    out["radix_hit_tokens"] = sum(hits)

    a = engine.add_sequence(PROMPT[:23], SamplingParams(max_tokens=30), "a")
    engine.prefill(a, chunk_size=5)  # chunked prefill
    la = engine.extend(a, PROMPT[23:30])
    engine.sample(a, la)
    b = engine.add_sequence(PROMPT[3:17], SamplingParams(max_tokens=30), "b")
    engine.prefill(b)
    c = engine.add_sequence(PROMPT[10:30], SamplingParams(max_tokens=30), "c")
    engine.prefill(c)
    (lb,), _ = engine.extend_and_decode([(b, [5, 6, 7])], [a, c])
    engine.sample(b, lb)
    for _ in range(3):
        engine.decode([a, b, c])
    out["steps_tokens"] = {s.seq_id: s.output_ids for s in (a, b, c)}
    out["steps_logits"] = {**rec.take(), "extend_a": la.float().cpu(), "extend_b": lb.float().cpu()}
    for s in (a, b, c):
        engine.free(s)

    k = engine.add_sequence(PROMPT, SamplingParams(max_tokens=CONTINUATION), "k")
    first = engine.prefill(k)
    out["export"] = {**kv_record(engine.export_kv(k)), "first": first}
    out["export_tail"] = kv_record(engine.export_kv(k, start_block=3))
    while not k.finished:
        engine.decode([k])
    out["continuation"] = k.output_ids
    out["continuation_logits"] = rec.take()["k"]
    engine.free(k)

    out["imports"] = {}
    for name, rec_kv in (imports or {}).items():
        s = engine.add_sequence(PROMPT, SamplingParams(max_tokens=CONTINUATION), f"imp-{name}")
        kv = KVBlocks(
            s.seq_id,
            rec_kv["hashes"],
            rec_kv["token_start"],
            rec_kv["token_end"],
            rec_kv["block_size"],
            rec_kv["data"],
        )
        engine.import_kv(s, kv, cache=False)
        engine.append_tokens(s, [rec_kv["first"]])
        while not s.finished:
            engine.decode([s])
        out["imports"][name] = {"tokens": s.output_ids, "logits": rec.take()[s.seq_id]}
        engine.free(s)
    engine.reuse_prefix = reuse  # type: ignore[method-assign]
    return out


def run_harness(
    size: int,
    models: list[tuple[str, str]],
    imports: dict[str, dict] | None = None,
    device: str = "cpu",
    deadline_s: float = 300.0,
    expert_parallel: bool = False,
) -> dict[str, Any]:
    """Run the scenarios on TP `size` instances of `models` (every rank a process of this one);
    rank 0's results. RuntimeError with the ranks' stderr when one fails or runs past the
    deadline (all are killed then)."""
    with tempfile.TemporaryDirectory(prefix="pddflow-tp-harness-") as tmp:
        out, imp = Path(tmp) / "results.pt", Path(tmp) / "imports.pt"
        torch.save(imports or {}, imp)
        common = ["--size", str(size), "--init", f"127.0.0.1:{free_port()}"]
        common += ["--models", json.dumps([list(m) for m in models]), "--device", device]
        common += ["--expert-parallel"] if expert_parallel else []
        logs = [open(Path(tmp) / f"rank-{r}.log", "w+b") for r in range(size)]  # noqa: SIM115
        procs = [
            subprocess.Popen(
                [*python_module("pddflow.testing.tp_harness"), "--rank", str(r), *common]
                + (["--out", str(out), "--imports", str(imp)] if r == 0 else []),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=logs[r],
            )
            for r in range(size)
        ]
        end = time.monotonic() + deadline_s
        try:
            for proc in procs:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        codes = [proc.returncode for proc in procs]
        if any(codes):
            tails = []
            for r, log in enumerate(logs):
                log.seek(0)
                tails.append(f"rank {r} (exit {codes[r]}): {log.read().decode()[-1500:]}")
            raise RuntimeError(f"TP {size} harness failed:\n" + "\n".join(tails))
        for log in logs:
            log.close()
        return torch.load(out, weights_only=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pddflow.testing.tp_harness")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--init", required=True, help="host:port of rank 0")
    p.add_argument("--models", required=True, help='JSON [["name", "checkpoint dir"], ...]')
    p.add_argument("--out", default="", help="rank 0: results file (torch.save)")
    p.add_argument("--imports", default="", help="torch.save file {name: {source: export}}")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (each rank cuda:RANK)")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--hold", action="store_true")
    p.add_argument("--expert-parallel", action="store_true", help="whole experts per rank")
    args = p.parse_args(argv)
    config = CONFIG if args.device == "cpu" else replace(CONFIG, device="cuda", dtype="float32")
    config = replace(config, expert_parallel=args.expert_parallel)
    device = torch.device(rank_device(args.rank, config.device))
    tp = join(TPConfig(args.size, args.rank, args.init, args.timeout), device)
    imports = torch.load(args.imports, weights_only=False) if args.imports else {}
    results = {}
    try:
        for name, path in json.loads(args.models):
            engine = Engine(load_model_source(path), config, tp)
            if args.hold:
                if engine.is_leader:
                    print("ready", flush=True)
                    time.sleep(600)
                engine.follow()
                return 0
            if not engine.is_leader:
                engine.follow()
                continue
            started = time.perf_counter()
            results[name] = run_scenarios(engine, imports.get(name))
            results[name]["seconds"] = round(time.perf_counter() - started, 2)
            engine.close()
        if args.out and (tp is None or tp.is_leader):
            torch.save(results, args.out)
        return 0
    finally:
        if tp is not None:
            tp.close()


if __name__ == "__main__":
    sys.exit(main())
