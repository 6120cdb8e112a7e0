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

from pddflow.runtime.launcher import Deployment
from pddflow.testing.chaos import cut_link, drill, kill

ROOT = Path(__file__).resolve().parents[1]
FAULTS = {
    "kill -9 prefill": kill("prefill/0"),
    "kill -9 relay": kill("relay/0"),
    "kill -9 main": kill("main/0"),
    "WAN cut for 3 s": cut_link("A-B", 3.0),
    "WAN black hole after 1 MB, 5 s": cut_link("A-B", 5.0, after_bytes=1_000_000),
}


def reference_engine():
    from pddflow.core.payloads import SamplingParams
    from pddflow.operators.engine import Engine

    eng = Engine.from_spec("builtin:tiny-llama")
    stops = tuple(eng.tokenizer.eos_token_ids)

    def greedy(prompt: str, n: int) -> list[int]:
        ids = eng.tokenizer.encode(prompt)
        return eng.generate([ids], SamplingParams(max_tokens=n, stop_token_ids=stops))[0].output_ids

    return greedy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--burst", type=int, default=8, help="concurrent requests when the fault hits")
    ap.add_argument("--after", type=int, default=4, help="requests sent after recovery")
    ap.add_argument("--wan-gbps", type=float, default=0.05)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    reference = reference_engine()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pddflow-chaos-") as tmp:
        dep = Deployment(ROOT / "graphs" / "pdd.yaml", Path(tmp), "--wan-gbps", str(a.wan_gbps))
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
