"""Fault drills against a real embedded deployment (`pddflow.testing.chaos`), one table row per
fault: requests sent during and after it, how many came back exact, as clean errors, wrong or
hung, and the seconds from the fault to the first request served exactly again.

    python benchmarks/chaos.py [--burst 8] [--wan-gbps 0.05] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from pddflow.bench.deploy_process import DeployProcess
from pddflow.testing.chaos import FAULTS, drill, greedy_reference

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--burst", type=int, default=8, help="concurrent requests when the fault hits")
    ap.add_argument("--after", type=int, default=4, help="requests sent after recovery")
    ap.add_argument("--wan-gbps", type=float, default=0.05)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    reference = greedy_reference()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pddflow-chaos-") as tmp:
        dep = DeployProcess(ROOT / "graphs" / "pdd.yaml", Path(tmp), "--wan-gbps", str(a.wan_gbps))
        try:
            for name, fault in FAULTS.items():
                print(f"drill: {name}", file=sys.stderr)
                rows.append(drill(dep, name, fault, reference, burst=a.burst, after=a.after))
        finally:
            dep.stop()
    if a.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    print("| fault | sent | exact | clean errors | wrong | hung | recovered after |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        rec = f"{r.recover_s:.1f} s" if r.recover_s is not None else "not within 90 s"
        cells = (r.fault, r.sent, r.exact, r.clean_errors, r.wrong, r.hung, rec)
        print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
