"""What the served model's architecture changes in PDD's case: the three 88-GPU graphs (PDD,
cross-DC PD, same-DC PD) simulated on one workload for each architecture, side by side.

The shipped graphs plan Llama-3-70B with fp8 weights and KV (160 KiB of KV a token, 4 GPUs a
replica). DeepSeek-V3 (MLA: 576 latent values a token a layer, about 69 KB; 671 GB of fp8 weights)
does not fit 4 GPUs, so its graphs keep each operator's devices and change the replica shape to
what holds the weights: 12 compute-heavy GPUs (gpu_a, 80 GiB) or 8 bandwidth-heavy ones (gpu_b,
141 GiB) a replica, as many replicas as the clusters' devices allow (same-DC: 7 x 12 of its 88).

    python benchmarks/arch_compare.py [--rps 8] [-n 4000] [--seed 0] [--json]
    python benchmarks/arch_compare.py --graphs-out DIR   # the graphs only, e.g. for pddflow size

Per architecture and graph: TTFT P50/P90/P99, TPOT P50, SLA attainment, SLA goodput, BCR, WAN
bytes and the P99 transfer, the relay's token share; and PDD's ratios against each baseline.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from pddflow.core.child_python import python_module

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = ("pdd_88", "cross_dc_pd_88", "same_dc_pd_88")
# arch -> graph -> operator -> (replicas, devices_per_replica); None: the shipped shapes
SHAPES: dict[str, dict[str, dict[str, tuple[int, int]]] | None] = {
    "llama-3-70b-fp8": None,
    "deepseek-v3": {
        "pdd_88": {"prefill": (3, 12), "relay": (1, 12), "main": (5, 8)},
        "cross_dc_pd_88": {"prefill": (4, 12), "main": (5, 8)},
        "same_dc_pd_88": {"prefill": (3, 12), "decode": (4, 12)},
    },
}


def graph_text(graph: str, arch: str) -> str:
    """The shipped graph planning `arch`, with its replica shapes."""
    text = (ROOT / "graphs" / "sim" / f"{graph}.yaml").read_text()
    text, n = re.subn(r"arch: [\w.-]+", f"arch: {arch}", text, count=1)
    assert n == 1, graph
    for op, (replicas, devices) in ((SHAPES[arch] or {}).get(graph) or {}).items():
        pattern = rf"(\n  {op}:\s*\{{[^}}]*?replicas: )\d+(,\s*devices_per_replica: )\d+"
        text, n = re.subn(pattern, rf"\g<1>{replicas}\g<2>{devices}", text)
        assert n == 1, (graph, op)
    return text


def simulate(paths: list[Path], a: argparse.Namespace) -> dict:
    args = ["simulate", *map(str, paths), "--rps", str(a.rps), "-n", str(a.n)]
    args += ["--seed", str(a.seed), "--json", "-q"]
    res = subprocess.run(
        [*python_module("pddflow.cli"), *args], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        sys.exit(f"pddflow {' '.join(args)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return json.loads(res.stdout)


def row(r: dict) -> dict:
    return {
        "ttft_s": {q: round(r["ttft_s"][q], 3) for q in ("p50", "p90", "p99")},
        "tpot_ms_p50": round(r["tpot_ms"]["p50"], 2),
        "sla_attainment": round(r["sla_attainment"], 4),
        "slo_goodput_rps": round(r["slo_goodput_rps"], 3),
        "gpus": r["gpus"],
        "cost_per_hour": r["cost_per_hour"],
        "bcr": round(r["bcr"], 1),
        "wan_gb": round(r["wan_bytes"] / 1e9, 1),
        "wan_transfer_p99_s": round(r["wan_transfer_s"]["p99"], 2) if r["wan_bytes"] else None,
        "relay_token_share": round(r["relay_token_share"], 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rps", type=float, default=8.0)
    p.add_argument("-n", type=int, default=4000, help="requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--graphs-out", type=Path, help="write each arch's graphs there and stop")
    a = p.parse_args()
    if a.graphs_out is not None:
        for arch in SHAPES:
            (a.graphs_out / arch).mkdir(parents=True, exist_ok=True)
            for g in GRAPHS:
                (a.graphs_out / arch / f"{g}.yaml").write_text(graph_text(g, arch))
        print(f"wrote {len(SHAPES) * len(GRAPHS)} graphs under {a.graphs_out}")
        return
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="pddflow-arch-") as tmp:
        for arch in SHAPES:
            paths = []
            for g in GRAPHS:
                path = Path(tmp) / arch / f"{g}.yaml"
                path.parent.mkdir(exist_ok=True)
                path.write_text(graph_text(g, arch))
                paths.append(path)
            print(f"simulating {arch}", file=sys.stderr)
            runs = {r["graph"]: row(r) for r in simulate(paths, a)["graphs"]}
            pdd = runs["pdd_88"]
            ratios = {
                base: {
                    "ttft_p99": round(pdd["ttft_s"]["p99"] / runs[base]["ttft_s"]["p99"], 3),
                    "ttft_p90": round(pdd["ttft_s"]["p90"] / runs[base]["ttft_s"]["p90"], 3),
                    "bcr": round(pdd["bcr"] / runs[base]["bcr"], 3),
                }
                for base in GRAPHS[1:]
            }
            out[arch] = {"graphs": runs, "pdd_over": ratios}
    if a.json:
        print(json.dumps({"rps": a.rps, "requests": a.n, "seed": a.seed, "archs": out}, indent=1))
        return
    for arch, res in out.items():
        print(f"\n{arch} (rps {a.rps}, {a.n} requests)")
        print(f"{'':24}" + "".join(f"{g:>18}" for g in GRAPHS))
        for label, get in (
            ("TTFT P50/P90/P99 (s)", lambda r: "/".join(f"{v:.2f}" for v in r["ttft_s"].values())),
            ("TPOT P50 (ms)", lambda r: f"{r['tpot_ms_p50']:.1f}"),
            ("SLA attainment", lambda r: f"{100 * r['sla_attainment']:.1f}%"),
            ("SLA goodput (req/s)", lambda r: f"{r['slo_goodput_rps']:.2f}"),
            ("GPUs / $ per hour", lambda r: f"{r['gpus']} / {r['cost_per_hour']:.0f}"),
            ("BCR", lambda r: f"{r['bcr']:.1f}"),
            ("WAN GB", lambda r: f"{r['wan_gb']:.0f}"),
            ("WAN transfer P99 (s)", lambda r: str(r["wan_transfer_p99_s"] or "-")),
            ("relay token share", lambda r: f"{100 * r['relay_token_share']:.1f}%"),
        ):
            print(f"{label:24}" + "".join(f"{get(res['graphs'][g]):>18}" for g in GRAPHS))
        for base, r in res["pdd_over"].items():
            print(f"PDD / {base}: TTFT P99 x{r['ttft_p99']}, P90 x{r['ttft_p90']}, BCR x{r['bcr']}")


if __name__ == "__main__":
    main()
