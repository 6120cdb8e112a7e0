"""Simulator fidelity against the real embedded deployment, round after round.

One round: calibrate (`pddflow bench engine --quick`), serve the workload for real (`pddflow bench
serve --per-request`: both graphs, one after the other), calibrate again, then simulate exactly
that workload (`pddflow simulate --serve-workload --per-request`) fitted to the median of the two
calibrations, twice: on the engine calibrations alone, and with the deployment calibration added
(`--calibrate` of an earlier `bench serve` report: the deployment's own prefill and decode CPU, wall
over CPU and KV export times; docs/simulator.md). The deployment calibration never comes from the
run it predicts: round k serves workload seed `--seed + k - 1` and is calibrated on round k-1's
report (round 1 on a probe run of seed `--seed - 1`, same size). The seed changes every prompt's
tokens, not the lengths (bench serve takes the same trace records), so consecutive runs are repeats
of one workload shape.
With the deployment calibration each prefill also draws its cost and its KV export time from the
measured ones, and the prediction is the median of `--replications` such replays (15: with 5, draw
noise alone moves a figure or two across the tolerance).

The baseline, side by side: `previous_run` predicts each round by the real figures of the run
before it (the one the deployment calibration comes from). How often the real deployment lands
within the tolerance of its own previous run is the noise floor of the comparison.

Reported per round and graph: TTFT P50 / P90 and TPOT P50, real and simulated, and the relative
error; at the end, how many figures fall within the tolerance (25%: the simulator issue's bar) and
the median error of each figure over the rounds, for both simulations. Run nothing else on the
machine meanwhile: the deployment and the calibrations are timing measurements.

The simulations run in this process, through the library `pddflow simulate` calls
(`pddflow.sim.runner`). `--ablate TERM` (repeatable) switches a calibration term off in every
graph's frozen `Calibration` (`ABLATIONS`) and keeps everything else: what that term is worth.

    python benchmarks/fidelity.py --rounds 3 [--out DIR] [--json] [--no-deployment-calibration]
    python benchmarks/fidelity.py --resimulate DIR [--seed S ...]   # saved rounds, this simulator
    python benchmarks/fidelity.py --resimulate DIR --ablate prefill_spread [--seed S ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pddflow.core.child_python import python_module
from pddflow.graph import load_plan
from pddflow.sim.calibration import Calibration, HostSpec, Measurements, is_serve_report
from pddflow.sim.metrics import request_rows
from pddflow.sim.runner import RunOptions, calibrated, simulate, with_wan_gbps
from pddflow.sim.serve_replay import DEFAULT_TRACE, serve_workload

FIGURES = (("ttft_s", "p50"), ("ttft_s", "p90"), ("tpot_ms", "p50"))


def _host(c: Calibration, **changes) -> Calibration:
    return c if c.host is None else replace(c, host=replace(c.host, **changes))


# every calibration term, switched off (each one alone)
ABLATIONS: dict[str, Callable[[Calibration], Calibration]] = {
    "prefill_host_factor": lambda c: replace(c, prefill_host_factor=1.0),
    "decode_host_factor": lambda c: replace(c, decode_host_factor=1.0),
    "prefill_spread": lambda c: replace(c, prefill_spread=()),
    "prefill_shipping": lambda c: replace(c, prefill_shipping=()),
    "prefill_wall": lambda c: replace(c, prefill_wall_over_cpu={}),
    "corun": lambda c: _host(c, corun=(1.0, 1.0)),
    "host_model": lambda c: replace(c, host=None),
}


def _pddflow(args: list[str], out: Path) -> dict:
    res = subprocess.run(
        [*python_module("pddflow.cli"), *args], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        sys.exit(f"pddflow {' '.join(args)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    out.write_text(res.stdout)
    return json.loads(res.stdout)


GRAPHS = ["graphs/cross_dc_pd.yaml", "graphs/pdd.yaml"]


def _workload(a: argparse.Namespace, seed: int) -> list[str]:
    return [
        "--sessions",
        str(a.sessions),
        "--turns",
        str(a.turns),
        "--wan-gbps",
        str(a.wan_gbps),
        "--seed",
        str(seed),
    ]


def probe(a: argparse.Namespace, out: Path) -> Path:
    """A bench serve run of another workload (seed - 1), only to calibrate round 1's deployment."""
    print(f"probe: serving workload seed {a.seed - 1} to calibrate the deployment", file=sys.stderr)
    path = out / "probe.json"
    _pddflow(
        ["bench", "serve", *GRAPHS, *_workload(a, a.seed - 1), "--json", "--per-request"], path
    )
    return path


def one_round(i: int, a: argparse.Namespace, out: Path, deployment: Path | None) -> dict:
    seed = a.seed + i - 1
    print(
        f"round {i}: calibrating, serving {' and '.join(GRAPHS)} (workload seed {seed}), "
        "calibrating again",
        file=sys.stderr,
    )
    eng = ["bench", "engine", "--quick", "--threads", "1", "--json"]
    _pddflow(eng, out / f"engine_before_{i}.json")
    _pddflow(
        ["bench", "serve", *GRAPHS, *_workload(a, seed), "--json", "--per-request"],
        out / f"real_{i}.json",
    )
    _pddflow(eng, out / f"engine_after_{i}.json")
    return simulate_round(i, a, out, out, deployment)


def simulate_round(
    i: int, a: argparse.Namespace, runs: Path, out: Path, deployment: Path | None
) -> dict:
    """Round i's simulations from its measurements in `runs` (engine calibrations, real report),
    written to `out`, and every figure against the real one."""
    seed = a.seed + i - 1
    real = json.loads((runs / f"real_{i}.json").read_text())
    engines = [runs / f"engine_before_{i}.json", runs / f"engine_after_{i}.json"]
    sims = {"engine": _simulate(a, seed, engines, 1, out / f"sim_engine_{i}.json")}
    if deployment is not None:
        sims["deployment"] = _simulate(
            a, seed, engines + [deployment], a.replications, out / f"sim_{i}.json"
        )
        sims["previous_run"] = json.loads(deployment.read_text())
    rows = []
    for k, r in enumerate(real["graphs"]):
        row = {"round": i, "seed": seed, "graph": Path(r["graph"]).stem, "errors": r["errors"]}
        for name, sim in sims.items():
            s = sim["graphs"][k]
            for metric, q in FIGURES:
                got, want = s[metric][q], r[metric][q]
                row.setdefault(name, {})[f"{metric}_{q}"] = {
                    "real": want,
                    "sim": got,
                    "error": round((got - want) / want, 4) if want else None,
                }
        rows.append(row)
    # (a simulation's calibration, never the previous run's)
    last = sims.get("deployment", sims["engine"])
    return {
        "round": i,
        "rows": rows,
        "calibration": [g.get("calibration", {}) for g in last["graphs"]],
    }


def _simulate(
    a: argparse.Namespace, seed: int, calibrate: list[Path], replications: int, out: Path
) -> dict:
    """What `pddflow simulate GRAPHS --serve-workload --calibrate ... --json --per-request` prints
    for this workload, with `--ablate`'s term switched off in every graph's calibration."""
    serve = [c for c in calibrate if is_serve_report(c)]
    measured = Measurements.load([c for c in calibrate if c not in serve], serve)
    host = HostSpec(float(os.cpu_count() or 1))
    plans = [with_wan_gbps(load_plan(g), a.wan_gbps) for g in GRAPHS]
    plans, cals = calibrated(plans, measured, host)
    wl = serve_workload(DEFAULT_TRACE, a.sessions, a.turns, plans[0].model.block_size, seed=seed)
    options = RunOptions(seed=seed, replications=replications, embedded=True, wan_jitter_seed=0)
    graphs = []
    for plan, cal in zip(plans, cals):
        for term in a.ablate or ():
            cal = ABLATIONS[term](cal)
        result, sim = simulate(plan, wl, cal, options)
        result["per_request"] = request_rows(sim)
        result["calibration"] = measured.report(plan.source)
        graphs.append(result)
    report = {"graphs": graphs}
    out.write_text(json.dumps(report, indent=2, default=str))
    return report


def resimulate(a: argparse.Namespace, runs: Path, out: Path) -> list[dict]:
    """Every round saved in `runs` (an earlier `--out`) simulated again with this tree's simulator:
    a simulator change checked against real runs in seconds, without serving anything."""
    rounds, i = [], 1
    deployment = runs / "probe.json" if not a.no_deployment_calibration else None
    if deployment is not None and not deployment.exists():
        sys.exit(
            f"{runs}: no probe.json; add --no-deployment-calibration to simulate on the engine "
            "calibrations only"
        )
    while (runs / f"real_{i}.json").exists():
        print(
            f"round {i}: simulating the saved run (workload seed {a.seed + i - 1})", file=sys.stderr
        )
        rounds.append(simulate_round(i, a, runs, out, deployment))
        if deployment is not None:
            deployment = runs / f"real_{i}.json"
        i += 1
    if not rounds:
        sys.exit(f"{runs}: no real_1.json; pass a directory an earlier `--out` filled")
    return rounds


def summary(rounds: list[dict], tolerance: float, sim: str) -> dict:
    rows = [row[sim] | {"graph": row["graph"]} for rd in rounds for row in rd["rows"] if sim in row]
    out: dict = {"rounds": len(rounds), "tolerance": tolerance, "figures": {}}
    ttft_ok = ttft_all = 0
    for graph in dict.fromkeys(r["graph"] for r in rows):
        for metric, q in FIGURES:
            errs = [
                r[f"{metric}_{q}"]["error"]
                for r in rows
                if r["graph"] == graph and r[f"{metric}_{q}"]["error"] is not None
            ]
            within = sum(abs(e) <= tolerance for e in errs)
            out["figures"][f"{graph} {metric} {q}"] = {
                "median_error": round(statistics.median(errs), 4) if errs else None,
                "within": within,
                "of": len(errs),
            }
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
    ap.add_argument("--seed", type=int, default=1, help="round k serves workload seed SEED + k - 1")
    ap.add_argument(
        "--replications",
        type=int,
        default=15,
        help="with the deployment calibration: replays per prediction (other draws of its "
        "random parts)",
    )
    ap.add_argument(
        "--no-deployment-calibration",
        action="store_true",
        help="simulate on the engine calibrations only (no probe run, no bench serve calibration)",
    )
    ap.add_argument(
        "--tolerance", type=float, default=0.25, help="relative error that counts as within"
    )
    ap.add_argument(
        "--out", type=Path, help="keep every round's raw JSON here (default: a temporary directory)"
    )
    ap.add_argument(
        "--resimulate",
        type=Path,
        metavar="DIR",
        help="serve nothing: simulate again the rounds an earlier --out DIR holds (give the same "
        "--seed, --sessions, --turns and --wan-gbps); simulations go to --out",
    )
    ap.add_argument(
        "--ablate",
        action="append",
        choices=sorted(ABLATIONS),
        help="simulate with this calibration term switched off (the rest unchanged; repeatable)",
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    with tempfile.TemporaryDirectory(prefix="pddflow-fidelity-") as tmp:
        out = a.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        if a.resimulate is not None:
            rounds = resimulate(a, a.resimulate, out)
        else:
            deployment = None if a.no_deployment_calibration else probe(a, out)
            rounds = []
            for i in range(1, a.rounds + 1):
                rounds.append(one_round(i, a, out, deployment))
                if deployment is not None:
                    deployment = out / f"real_{i}.json"  # the next round's deployment calibration
    sims = ("engine",) if a.no_deployment_calibration else ("engine", "deployment", "previous_run")
    result = {
        "workload": {
            "sessions": a.sessions,
            "turns": a.turns,
            "wan_gbps": a.wan_gbps,
            "first_seed": a.seed,
        },
        "ablated": a.ablate,
        "rounds": rounds,
        "summary": {name: summary(rounds, a.tolerance, name) for name in sims},
    }
    if a.json:
        print(json.dumps(result, indent=2))
        return
    for rd in rounds:
        for row in rd["rows"]:
            for name in sims:
                f = row[name]
                cells = [
                    f"{m} {q} {f[f'{m}_{q}']['real']:.3f} -> {f[f'{m}_{q}']['sim']:.3f} "
                    f"({f[f'{m}_{q}']['error']:+.0%})"
                    for m, q in FIGURES
                ]
                print(f"round {rd['round']} {row['graph']:<12} {name:<12} " + " | ".join(cells))
    for name in sims:
        s = result["summary"][name]
        what = "the real run before" if name == "previous_run" else f"the {name} calibration"
        print(f"predicted by {what}: TTFT figures within {s['tolerance']:.0%}: {s['ttft_within']}")
        for fig, f in s["figures"].items():
            print(f"  {fig}: median error {f['median_error']:+.0%}, within {f['within']}/{f['of']}")


if __name__ == "__main__":
    main()
