"""Fault drills against a real embedded deployment, one table row per fault.

Worker and link faults (`pddflow.testing.chaos`): requests sent during and after it, how many came
back exact, as clean errors, wrong or hung, and the seconds from the fault to the first request
served exactly again. Partitions of the A-B link (`pddflow.testing.partition`): split both ways
for --split-s seconds each, one way each way for the longest, and lossy; per phase the requests
were in at the split, their outcomes; the seconds to route around main and back; the blocks left
after healing.

    python benchmarks/chaos.py [--only faults|partitions] [--split-s 5 60] [--loss 0.2]
        [--burst 8] [--wan-gbps 0.05] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from pddflow.bench.deploy_process import DeployProcess
from pddflow.testing.chaos import FAULTS, drill, greedy_reference
from pddflow.testing.partition import (
    PHASES,
    Fault,
    PartitionResult,
    partition_drill,
    results_table,
)

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--burst", type=int, default=8, help="concurrent requests when the fault hits")
    ap.add_argument("--after", type=int, default=4, help="requests sent after recovery")
    ap.add_argument("--wan-gbps", type=float, default=0.05)
    ap.add_argument("--only", choices=("faults", "partitions"), help="default: both")
    ap.add_argument(
        "--split-s",
        type=float,
        nargs="+",
        default=[5.0, 60.0],
        help="durations of the two-way splits (the lease is pdd.yaml's: 10 s); the one-way "
        "splits last the longest of them",
    )
    ap.add_argument("--loss", type=float, default=0.2, help="the lossy drill's loss, for 20 s")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not all(0 < s <= 600 for s in a.split_s) or not 0 < a.loss <= 1:
        ap.error("--split-s must be in (0, 600] seconds and --loss in (0, 1]")
    reference = greedy_reference()
    rows, splits = [], []
    with tempfile.TemporaryDirectory(prefix="pddflow-chaos-") as tmp:
        dep = DeployProcess(ROOT / "graphs" / "pdd.yaml", Path(tmp), "--wan-gbps", str(a.wan_gbps))
        try:
            for name, fault in FAULTS.items() if a.only != "partitions" else ():
                print(f"drill: {name}", file=sys.stderr)
                rows.append(drill(dep, name, fault, reference, burst=a.burst, after=a.after))
            for fault in _partitions(a) if a.only != "faults" else ():
                print(f"drill: {fault.name}", file=sys.stderr)
                splits.append(partition_drill(dep, fault, reference, deadline_s=120.0))
        finally:
            dep.stop()
    if a.json:
        print(json.dumps([r.to_dict() for r in rows + splits], indent=2))
        return
    if rows:
        _fault_table(rows)
    if splits:
        _partition_tables(splits)


def _partitions(a: argparse.Namespace) -> list[Fault]:
    longest = max(a.split_s)
    faults = [Fault(f"split {s:g} s", s) for s in a.split_s]
    faults += [
        Fault(f"one-way {longest:g} s, {c}'s sends lost", longest, from_cluster=c) for c in "AB"
    ]
    return faults + [Fault(f"{a.loss:.0%} loss for 20 s", 20.0, loss=a.loss)]


def _fault_table(rows: list) -> None:
    print("| fault | sent | exact | clean errors | wrong | hung | recovered after |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        rec = f"{r.recover_s:.1f} s" if r.recover_s is not None else "not within 90 s"
        cells = (r.fault, r.sent, r.exact, r.clean_errors, r.wrong, r.hung, rec)
        print("| " + " | ".join(map(str, cells)) + " |")


def _partition_tables(splits: list[PartitionResult]) -> None:
    print("\n" + results_table(splits))
    print("\nexact / sent by the phase each request was in at the split:\n")
    print("| phase | " + " | ".join(r.fault for r in splits) + " |")
    print("|---|" + "---|" * len(splits))
    for phase in (*PHASES, "?"):
        cells = []
        for r in splits:
            by = r.phases.get(phase, {})
            cells.append(f"{by.get('exact', 0)}/{sum(by.values())}" if by else "-")
        if any(c != "-" for c in cells):
            print(f"| {phase} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
