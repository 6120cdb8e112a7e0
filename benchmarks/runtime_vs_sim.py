"""The runtime against the simulator at fleet scale: one `bench serve` workload served by the real
runtime over the modeled engine (`deploy --engine modeled --profile production`: every replica of
the 88-GPU graphs on this machine) and replayed by `pddflow simulate --serve-workload` on the same
graphs, side by side.

    python benchmarks/runtime_vs_sim.py [--graphs pdd_88,same_dc_pd_88] [--sessions 32] [--json]

Per graph: TTFT and TPOT P50/P90, SLA attainment, the relay's token share and WAN bytes (the
runtime's payloads divided by --kv-scale: the arch's bytes, as the simulator counts them), and
the runtime over the simulator for each. Both run the device model uncalibrated (the modeled
engine's steps are the simulator's); what differs is everything else: the scheduler's measured
inputs, the channels, the workers' loops and the host's cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from pddflow.core.child_python import python_module
from pddflow.runtime.deploy.modeled import DEFAULT_KV_SCALE  # what deploy runs

ROOT = Path(__file__).resolve().parents[1]


def pddflow(args: list[str]) -> dict:
    res = subprocess.run(
        [*python_module("pddflow.cli"), *args], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        sys.exit(f"pddflow {' '.join(args)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return json.loads(res.stdout)


def figures(ttft, tpot, sla, relay, wan_bytes, errors, variants) -> dict:
    return {
        "ttft_p50_s": ttft["p50"],
        "ttft_p90_s": ttft["p90"],
        "tpot_p50_ms": tpot["p50"],
        "tpot_p90_ms": tpot["p90"],
        "sla_attainment": sla,
        "relay_token_share": relay,
        "wan_gb": round(wan_bytes / 1e9, 3),
        "errors": errors,
        "variants": variants,
    }


def workload_args(a: argparse.Namespace) -> list[str]:
    return [
        *("--sessions", str(a.sessions), "--turns", str(a.turns), "--rps", str(a.rps)),
        *("--think", str(a.think), "--scale", str(a.scale), "--max-output", str(a.max_output)),
        *("--seed", str(a.seed)),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--graphs", default="pdd_88,same_dc_pd_88")
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--rps", type=float, default=2.0, help="session starts per second")
    p.add_argument("--think", type=float, default=2.0)
    p.add_argument("--scale", type=float, default=0.25, help="tokens per trace token")
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    names = [g.strip() for g in a.graphs.split(",") if g.strip()]
    paths = [str(ROOT / "graphs" / "sim" / f"{g}.yaml") for g in names]
    served = pddflow(
        ["bench", "serve", *paths, "--engine", "modeled", "--profile", "production"]
        + ["--cpu-pinning", "none", "--json", *workload_args(a)]
    )
    rows = []
    for name, path, r in zip(names, paths, served["graphs"], strict=True):
        s = pddflow(
            ["simulate", path, "--serve-workload", "--profile", "production", "--json", "-q"]
            + workload_args(a)
        )
        runtime = figures(
            r["ttft_s"], r["tpot_ms"], r["slo_attainment"], r["relay_token_share"],
            r["wan_bytes"] / DEFAULT_KV_SCALE, r["errors"], r["requests_by_variant"],
        )  # fmt: skip
        sim = figures(
            s["ttft_s"], s["tpot_ms"], s["sla_attainment"], s["relay_token_share"],
            s["wan_bytes"], s["failed"], dict(s["variants"]),
        )  # fmt: skip
        ratio = {
            k: round(runtime[k] / sim[k], 3) if sim[k] else None
            for k in runtime
            if k not in ("errors", "variants")
        }
        rows.append(
            {"graph": name, "runtime": runtime, "simulated": sim, "runtime_over_simulated": ratio}
        )
    out = {"workload": served["workload"], "graphs": rows}
    if a.json:
        print(json.dumps(out, indent=2))
        return
    keys = [k for k in rows[0]["runtime"] if k != "variants"] if rows else []
    for row in rows:
        print(f"\n{row['graph']}: {'':>18}{'runtime':>10} {'simulated':>10} {'ratio':>7}")
        for k in keys:
            ratio = row["runtime_over_simulated"].get(k)
            print(f"  {k:<26}{row['runtime'][k]!s:>10} {row['simulated'][k]!s:>10} {ratio!s:>7}")


if __name__ == "__main__":
    main()
