"""Simulator fidelity against the real embedded deployment, round after round.

One round: calibrate (`pddflow bench engine --quick`), serve the workload for real (`pddflow bench
serve --per-request`: both graphs, one after the other), calibrate again, then simulate exactly
that workload (`pddflow simulate --serve-workload --per-request`) fitted to the median of the two
calibrations. Reported per round and graph: TTFT P50 / P90 and TPOT P50, real and simulated, and
the relative error; at the end, how many figures fall within the tolerance (25%: the simulator
issue's bar) and the median error of each figure over the rounds. Run nothing else on the machine
meanwhile: the deployment and the calibrations are timing measurements.

    python benchmarks/fidelity.py --rounds 3 [--out DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

FIGURES = (("ttft_s", "p50"), ("ttft_s", "p90"), ("tpot_ms", "p50"))


def _pddflow(args: list[str], out: Path) -> dict:
    res = subprocess.run([sys.executable, "-m", "pddflow.cli", *args], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        sys.exit(f"pddflow {' '.join(args)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    out.write_text(res.stdout)
    return json.loads(res.stdout)


def one_round(i: int, a: argparse.Namespace, out: Path) -> dict:
    wl = ["--sessions", str(a.sessions), "--turns", str(a.turns), "--wan-gbps", str(a.wan_gbps)]
    graphs = ["graphs/cross_dc_pd.yaml", "graphs/pdd.yaml"]
    print(f"round {i}: calibrating, serving {' and '.join(graphs)}, calibrating again", file=sys.stderr)
    eng = ["bench", "engine", "--quick", "--threads", "1", "--json"]
    _pddflow(eng, out / f"engine_before_{i}.json")
    real = _pddflow(["bench", "serve", *graphs, *wl, "--json", "--per-request"], out / f"real_{i}.json")
    _pddflow(eng, out / f"engine_after_{i}.json")
    sim = _pddflow(["simulate", *graphs, "--serve-workload", *wl, "--json", "-q", "--per-request",
                    "--calibrate", str(out / f"engine_before_{i}.json"),
                    "--calibrate", str(out / f"engine_after_{i}.json")], out / f"sim_{i}.json")
    rows = []
    for r, s in zip(real["graphs"], sim["graphs"]):
        row = {"round": i, "graph": Path(r["graph"]).stem, "errors": r["errors"]}
        for metric, q in FIGURES:
            got, want = s[metric][q], r[metric][q]
            row[f"{metric}_{q}"] = {"real": want, "sim": got, "error": round((got - want) / want, 4) if want else None}
        rows.append(row)
    return {"round": i, "rows": rows, "calibration": sim["graphs"][0].get("calibration", {})}


def summary(rounds: list[dict], tolerance: float) -> dict:
    rows = [row for rd in rounds for row in rd["rows"]]
    out: dict = {"rounds": len(rounds), "tolerance": tolerance, "figures": {}}
    ttft_ok = ttft_all = 0
    for graph in dict.fromkeys(r["graph"] for r in rows):
        for metric, q in FIGURES:
            errs = [r[f"{metric}_{q}"]["error"] for r in rows if r["graph"] == graph and r[f"{metric}_{q}"]["error"] is not None]
            within = sum(abs(e) <= tolerance for e in errs)
            out["figures"][f"{graph} {metric} {q}"] = {"median_error": round(statistics.median(errs), 4) if errs else None,
                                                      "within": within, "of": len(errs)}
            if metric == "ttft_s":
                ttft_ok, ttft_all = ttft_ok + within, ttft_all + len(errs)
    out["ttft_within"] = f"{ttft_ok}/{ttft_all}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--wan-gbps", type=float, default=0.05)
    ap.add_argument("--tolerance", type=float, default=0.25, help="relative error that counts as within")
    ap.add_argument("--out", type=Path, help="keep every round's raw JSON here (default: a temporary directory)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    with tempfile.TemporaryDirectory(prefix="pddflow-fidelity-") as tmp:
        out = a.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        rounds = [one_round(i, a, out) for i in range(1, a.rounds + 1)]
    result = {"workload": {"sessions": a.sessions, "turns": a.turns, "wan_gbps": a.wan_gbps},
              "rounds": rounds, "summary": summary(rounds, a.tolerance)}
    if a.json:
        print(json.dumps(result, indent=2))
        return
    for rd in rounds:
        for row in rd["rows"]:
            cells = [f"{m} {q} {row[f'{m}_{q}']['real']:.3f} -> {row[f'{m}_{q}']['sim']:.3f} "
                     f"({row[f'{m}_{q}']['error']:+.0%})" for m, q in FIGURES]
            print(f"round {rd['round']} {row['graph']:<12} " + " | ".join(cells))
    s = result["summary"]
    print(f"TTFT figures within {s['tolerance']:.0%}: {s['ttft_within']}")
    for name, f in s["figures"].items():
        print(f"  {name}: median error {f['median_error']:+.0%}, within {f['within']}/{f['of']}")


if __name__ == "__main__":
    main()
