"""A worker process, one operator instance: python -m pddflow.runtime.workers WIRING INSTANCE"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from pddflow.core.cpu_layout import pin_self
from pddflow.runtime.wiring import Wiring
from pddflow.runtime.workers.roster import worker_class


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m pddflow.runtime.workers WIRING.json INSTANCE", file=sys.stderr)
        return 2
    wiring_file, instance = argv
    wiring = Wiring.load(Path(wiring_file))
    # before torch starts its threads
    pin_self(wiring.cpus.get(instance, ()), wiring.nice.get(instance, 0))
    cls = worker_class(wiring.plan().operator_of(instance).op_type)
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
