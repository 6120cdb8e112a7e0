"""`pddflow bench serve` on the Ray backend against the local backend, same workload, same machine.

Stands up a three-node Ray cluster as docs/deploy-ray.md does ("Trying it on one machine": a head
node, a node carrying cluster A, one carrying cluster B, all inside a private network namespace of
this script's own, so every address is 127.0.0.1 and nothing leaves it; needs root and `unshare`),
then runs `pddflow bench serve graphs/cross_dc_pd.yaml graphs/pdd.yaml --json` once per backend and
round, alternating which backend goes first (a drift of the machine's load then hits both alike).

Reported per run and, over the rounds, as medians: pdd / cross_dc_pd TTFT P50, P90 and P99 (the
ratios `bench serve` computes; a ratio within a run is what survives this machine's noise), and
each backend's errors. Run nothing else on the machine meanwhile.

    python benchmarks/ray_vs_local.py --rounds 2 --sessions 6 --turns 6 [--json] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pddflow.testing.ray_cluster import (  # noqa: E402 - after the path
    NetNamespace,
    RayCluster,
    RayNode,
    unshare_refused,
)

NODES = [
    RayNode({}, num_cpus=1),
    RayNode({"pddflow_cluster_A": 1}, num_cpus=2),
    RayNode({"pddflow_cluster_B": 1}, num_cpus=1),
]
GRAPHS = ["graphs/cross_dc_pd.yaml", "graphs/pdd.yaml"]
FIGURES = ("ttft_p50", "ttft_p90", "ttft_p99")


def serve(backend: str, address: str, args: argparse.Namespace) -> dict:
    argv = [
        str(Path(sys.executable).with_name("pddflow")),
        "bench",
        "serve",
        *GRAPHS,
        "--sessions",
        str(args.sessions),
        "--turns",
        str(args.turns),
        "--seed",
        str(args.seed),
        "--json",
        "--backend",
        backend,
    ]
    if backend == "ray":
        argv += ["--address", address]
    else:
        argv += ["--cpu-pinning", args.local_cpu_pinning]
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=args.timeout)
    if r.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr.decode()[-3000:]}"
        )
    out = json.loads(r.stdout)
    (ratios,) = out["ratios_vs_first"].values()  # pdd against cross_dc_pd, the first
    return {
        "backend": backend,
        "wall_s": round(time.monotonic() - t0, 1),
        "ratios": {f: ratios[f] for f in FIGURES},
        "ttft_s": {Path(g["graph"]).stem: g["ttft_s"] for g in out["graphs"]},
        "errors": {Path(g["graph"]).stem: g.get("errors", 0) for g in out["graphs"]},
        "requests": out["workload"]["requests"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800.0, help="one bench serve run, s")
    ap.add_argument(
        "--local-cpu-pinning",
        default="auto",
        choices=("auto", "none"),
        help="the local backend's (none: its workers float over all cores, as Ray's do)",
    )
    ap.add_argument("--out", type=Path, help="keep every run's report here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    why = unshare_refused()
    if why is not None:
        print(f"needs a private network namespace: {why}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="pddflow-raybench-", dir="/tmp"))
    ns = NetNamespace()
    runs = []
    try:
        cluster = RayCluster(NODES, tmp)
        for k in range(args.rounds):
            order = ("local", "ray") if k % 2 == 0 else ("ray", "local")
            for backend in order:
                print(f"round {k + 1}: {backend} ...", file=sys.stderr, flush=True)
                run = {"round": k + 1, **serve(backend, cluster.address, args)}
                runs.append(run)
                print(f"  {json.dumps(run['ratios'])} in {run['wall_s']} s", file=sys.stderr)
    finally:
        ns.close()
        shutil.rmtree(tmp, ignore_errors=True)
    medians = {
        b: {
            f: statistics.median(r["ratios"][f] for r in runs if r["backend"] == b) for f in FIGURES
        }
        for b in ("local", "ray")
    }
    # the noise floor: how far one backend's own rounds lie apart
    spread = {
        b: {
            f: [min(r["ratios"][f] for r in runs if r["backend"] == b),
                max(r["ratios"][f] for r in runs if r["backend"] == b)]
            for f in FIGURES
        }
        for b in ("local", "ray")
    }  # fmt: skip
    report = {
        "graphs": GRAPHS,
        "sessions": args.sessions,
        "turns": args.turns,
        "rounds": args.rounds,
        "local_cpu_pinning": args.local_cpu_pinning,
        "runs": runs,
        "median_pdd_over_cross_dc_pd": medians,
        "range_pdd_over_cross_dc_pd": spread,
        "ray_over_local": {f: round(medians["ray"][f] / medians["local"][f], 3) for f in FIGURES},
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ray_vs_local.json").write_text(json.dumps(report, indent=2))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for b, m in medians.items():
            print(
                f"{b:>5}: pdd / cross_dc_pd TTFT "
                + ", ".join(
                    f"{f[5:]} {v:.2f} ({spread[b][f][0]:.2f}-{spread[b][f][1]:.2f})"
                    for f, v in m.items()
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
