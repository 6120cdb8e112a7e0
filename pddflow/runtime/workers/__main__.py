"""A worker process: one rank of an operator instance.

    python -m pddflow.runtime.workers WIRING INSTANCE [RANK]

Rank 0 (the default) leads: it runs the instance's worker loop; a rank > 0 follows its steps."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from pddflow.core.cpu_layout import pin_self
from pddflow.core.parent_death import die_with_parent
from pddflow.core.startup_gc import starting
from pddflow.graph.plan import rank_name
from pddflow.runtime.wiring import Wiring
from pddflow.runtime.workers.ranks import run_follower
from pddflow.runtime.workers.roster import worker_class


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (2, 3) or (len(argv) == 3 and not argv[2].isdigit()):
        print(
            "usage: python -m pddflow.runtime.workers WIRING.json INSTANCE [RANK]", file=sys.stderr
        )
        return 2
    die_with_parent()
    wiring_file, instance = argv[:2]
    rank = int(argv[2]) if len(argv) == 3 else 0
    wiring = Wiring.load(Path(wiring_file))
    name = rank_name(instance, rank)
    # before torch starts its threads
    pin_self(wiring.cpus.get(name, ()), wiring.nice.get(name, 0))
    if rank:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # its leader stops it, or this
        return run_follower(wiring, instance, rank)
    cls = worker_class(wiring.plan().operator_of(instance).op_type)
    with starting():  # torch's import and the engine's build
        worker = cls(wiring, instance)
    signal.signal(signal.SIGTERM, lambda *_: worker.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: worker.stopping.set())
    print(f"{instance} ready (pid {os.getpid()})", flush=True)
    try:
        worker.run()
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
