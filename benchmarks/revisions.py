"""`pddflow bench serve` of two revisions of this repository, same workload, same machine: did a
change (a refactor, above all) move the served figures?

Checks each revision out into a temporary worktree and runs `python -m pddflow.cli bench serve ...
--json` with that tree first on PYTHONPATH (the interpreter and its packages are this one's), once
per revision and round, alternating which goes first so a drift of the machine's load hits both
alike. Reported per run and, over the rounds, as medians: each graph's TTFT P50 / P90 and TPOT P50,
the deploy process's CPU per streamed token and the tokens/s, and the ratios against the first
graph that `bench serve` computes (a ratio within one run is what survives this machine's noise);
errors per graph. Run nothing else meanwhile.

    python benchmarks/revisions.py BASE [HEAD] --rounds 3 [--json] -- --sessions 6 --turns 6 \\
        --wan-gbps 0.05

HEAD defaults to the working tree's HEAD commit; arguments after `--` go to `bench serve`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pddflow.core.child_python import python_module

ROOT = Path(__file__).resolve().parents[1]
FIGURES = (("ttft_s", "p50"), ("ttft_s", "p90"), ("tpot_ms", "p50"))
RATIOS = ("ttft_p50", "ttft_p90", "tpot_p50")


def checkout(rev: str, into: Path) -> Path:
    tree = into / rev.replace("/", "_")
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
        check=True,
        capture_output=True,
    )
    return tree


def serve(tree: Path, bench_args: list[str], timeout_s: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [*python_module("pddflow.cli"), "bench", "serve", *bench_args, "--json"]
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=tree, env=env, capture_output=True, timeout=timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} in {tree} failed:\n{r.stderr.decode()[-3000:]}")
    out = json.loads(r.stdout)
    graphs = {Path(g["graph"]).stem: g for g in out["graphs"]}
    return {
        "wall_s": round(time.monotonic() - t0, 1),
        "figures": {name: {f"{k}_{q}": g[k][q] for k, q in FIGURES} for name, g in graphs.items()},
        "ratios": {
            Path(name).stem: {r: v.get(r) for r in RATIOS}
            for name, v in out["ratios_vs_first"].items()
        },
        "errors": {name: g.get("errors", 0) for name, g in graphs.items()},
        # the deploy process's CPU (frontend, API, deployer) per streamed token, and tokens/s
        "frontend": {
            name: {
                "us_per_token": _per_token(g.get("host_cpu")),
                "tokens_per_s": round(g["host_cpu"]["output_tokens"] / g["wall_s"], 1)
                if g.get("host_cpu") and g.get("wall_s")
                else None,
            }
            for name, g in graphs.items()
        },
    }


def _per_token(host: dict | None) -> float | None:
    if not host or not host.get("output_tokens"):
        return None
    return round(host["frontend_s"] / host["output_tokens"] * 1e6, 1)


def medians(runs: list[dict]) -> dict:
    out: dict = {"figures": {}, "ratios": {}, "frontend": {}}
    for part in ("figures", "ratios", "frontend"):
        for graph in runs[0][part]:
            keys = runs[0][part][graph]
            out[part][graph] = {
                k: round(statistics.median(r[part][graph][k] for r in runs), 4)
                for k in keys
                if all(r[part][graph][k] is not None for r in runs)
            }
    out["errors"] = sum(sum(r["errors"].values()) for r in runs)
    return out


def main() -> int:
    argv = sys.argv[1:]
    bench_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="the baseline revision (a commit, tag or branch)")
    ap.add_argument("head", nargs="?", default="HEAD", help="the revision measured against it")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800.0, help="one bench serve run, s")
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON")
    args = ap.parse_args(argv)
    revs = {"base": args.base, "head": args.head}
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="pddflow-revisions-") as tmp:
        trees = {which: checkout(rev, Path(tmp)) for which, rev in revs.items()}
        try:
            for i in range(args.rounds):
                order = ("base", "head") if i % 2 == 0 else ("head", "base")
                for which in order:
                    run = serve(trees[which], bench_args, args.timeout)
                    runs[which].append(run)
                    print(f"round {i + 1} {which}: {json.dumps(run)}", file=sys.stderr)
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    capture_output=True,
                )
    result = {
        "revisions": revs,
        "bench_serve": bench_args,
        "runs": runs,
        "medians": {which: medians(r) for which, r in runs.items()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for which in ("base", "head"):
        m = result["medians"][which]
        print(f"{which} ({revs[which]}), medians of {args.rounds} runs, {m['errors']} errors")
        for graph, f in m["figures"].items():
            print(f"  {graph}: " + ", ".join(f"{k} {v:g}" for k, v in f.items()))
        for graph, f in m["frontend"].items():
            print(f"  {graph} frontend: " + ", ".join(f"{k} {v:g}" for k, v in f.items()))
        for graph, r in m["ratios"].items():
            print(f"  {graph} / first: " + ", ".join(f"{k} x{v:g}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
