"""The control plane's costs as the instance count grows: `graphs/sim/pdd_88.yaml` deployed on
the modeled engine with every replica (`deploy --engine modeled --profile production`) at 6, 22
and 44 instances, each serving the same `bench serve` workload, with 1 and N API processes
(`deploy --api-servers`), alternated over `--rounds` so the machine's drift falls on both.

    python benchmarks/fleet_scale.py [--sizes 6,22,44] [--api-servers 1,2] [--rounds 2] [--json]

Per size: start-up time, worker and frontend memory, the frontend's CPU per request and per
streamed token (the router's, the API processes' and the workers' apart), the streamed tokens/s,
the workers' reports per second (by kind), the time to route
a request, and the served TTFT/TPOT (which should not move with the instance count while the
control plane keeps up)."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pddflow.core.child_python import python_module

ROOT = Path(__file__).resolve().parents[1]
# instances -> (prefill, relay, main) replicas; 22 is the shipped pdd_88
SHAPES = {6: (3, 1, 2), 22: (10, 2, 10), 44: (20, 4, 20)}


def graph_text(size: int) -> str:
    """pdd_88 with `size` instances, its clusters grown to hold them (4 devices a replica)."""
    prefill, relay, main = SHAPES[size]
    text = (ROOT / "graphs" / "sim" / "pdd_88.yaml").read_text()
    text = re.sub(r"name: pdd_88", f"name: pdd_{size}i", text, count=1)
    for op, n in (("prefill", prefill), ("relay", relay), ("main", main)):
        text, k = re.subn(rf"(\n  {op}:\s*\{{[^}}]*?replicas: )\d+", rf"\g<1>{n}", text)
        assert k == 1, op
    text = re.sub(r"gpu_a: 48", f"gpu_a: {max(48, 4 * (prefill + relay))}", text)
    return re.sub(r"gpu_b: 40", f"gpu_b: {max(40, 4 * main)}", text)


def bench(paths: list[Path], a: argparse.Namespace, api_servers: int) -> dict:
    args = ["bench", "serve", *map(str, paths), "--engine", "modeled", "--profile", "production"]
    args += ["--api-servers", str(api_servers), "--stream-interval", str(a.stream_interval)]
    args += ["--sessions", str(a.sessions), "--turns", str(a.turns), "--rps", str(a.rps)]
    args += ["--scale", str(a.scale), "--max-output", str(a.max_output), "--think", str(a.think)]
    args += ["--cpu-pinning", "none", "--json"]
    res = subprocess.run(
        [*python_module("pddflow.cli"), *args], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        sys.exit(f"pddflow {' '.join(args)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return json.loads(res.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="6,22,44", help="instance counts (of 6, 22, 44)")
    p.add_argument("--sessions", type=int, default=24)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--rps", type=float, default=2.0, help="session starts per second")
    p.add_argument("--scale", type=float, default=0.25, help="tokens per trace token")
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--think", type=float, default=1.0)
    p.add_argument("--api-servers", default="1", help="API process counts, each run in turn")
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1, help="every API count this many times")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    bad = [s for s in sizes if s not in SHAPES]
    if bad:
        sys.exit(f"--sizes: {bad} not among {sorted(SHAPES)}")
    try:
        counts = [int(n) for n in a.api_servers.split(",")]
    except ValueError:
        sys.exit(f"--api-servers: {a.api_servers!r} is not a comma-separated list of counts (1,2)")
    if min(counts) < 1 or a.rounds < 1:
        sys.exit("--api-servers counts and --rounds are at least 1")
    with tempfile.TemporaryDirectory(prefix="pddflow-fleet-") as d:
        paths = []
        for size in sizes:
            path = Path(d) / f"pdd_{size}i.yaml"
            path.write_text(graph_text(size))
            paths.append(path)
        runs = [(n, r, bench(paths, a, n)) for r in range(a.rounds) for n in counts]
    rows = []
    for n, rnd, out in runs:
        rows += row_of(sizes, n, rnd, out)
    result = {"workload": runs[0][2]["workload"], "sizes": rows, "summary": summary(rows)}
    if a.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{'instances':>9} {'api':>3} {'start s':>7} {'worker MiB':>10} {'frontend MiB':>12} "
        f"{'fe ms/req':>9} {'fe us/tok':>9} {'router':>7} {'api':>7} {'workers':>7} "
        f"{'tok/s':>7} {'reports/s':>9} {'route ms':>8} {'TTFT p50':>8} {'TPOT p50':>8} err"
    )
    for r in rows:
        split = r.get("cpu_us_per_token") or {}
        print(
            f"{r['instances']:>9} {r['api_servers']:>3} {r.get('startup_s', 0):>7} "
            f"{(r.get('worker_rss_mib') or {}).get('mean')!s:>10} "
            f"{r.get('frontend_rss_mib')!s:>12} {r.get('frontend_cpu_ms_per_request')!s:>9} "
            f"{r.get('frontend_cpu_us_per_token')!s:>9} {split.get('router')!s:>7} "
            f"{split.get('api')!s:>7} {split.get('workers')!s:>7} "
            f"{r.get('streamed_tokens_per_s')!s:>7} "
            f"{(r.get('reports_per_s') or {}).get('all')!s:>9} "
            f"{(r.get('route_ms') or {}).get('mean')!s:>8} {r['ttft_s']['p50']:>8} "
            f"{r['tpot_ms']['p50']:>8} {r['errors']}"
        )
    for s in result["summary"]:
        print(
            f"{s['instances']} instances, {s['api_servers']} API: median {s['tokens_per_s']} "
            f"tokens/s ({s['vs_one_api']}x one API), frontend {s['frontend_us_per_token']} us/token"
        )


def row_of(sizes: list[int], api_servers: int, rnd: int, out: dict) -> list[dict]:
    rows = []
    for size, g in zip(sizes, out["graphs"], strict=True):
        c = g["control_plane"] or {}
        rows.append(
            {
                "instances": size,
                "api_servers": api_servers,
                "round": rnd,
                "requests": g["requests"],
                "errors": g["errors"],
                **c,
                "ttft_s": g["ttft_s"],
                "tpot_ms": g["tpot_ms"],
            }
        )
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per instance count and API count: the rounds' medians, tokens/s against one API process."""
    keys = sorted({(r["instances"], r["api_servers"]) for r in rows})
    med = {
        k: (
            statistics.median(r["streamed_tokens_per_s"] or 0 for r in rows if key(r) == k),
            statistics.median(r["frontend_cpu_us_per_token"] or 0 for r in rows if key(r) == k),
        )
        for k in keys
    }
    return [
        {
            "instances": i,
            "api_servers": n,
            "tokens_per_s": med[(i, n)][0],
            "frontend_us_per_token": med[(i, n)][1],
            "vs_one_api": round(med[(i, n)][0] / med[(i, 1)][0], 3) if (i, 1) in med else None,
        }
        for i, n in keys
    ]


def key(r: dict) -> tuple[int, int]:
    return r["instances"], r["api_servers"]


if __name__ == "__main__":
    main()
