"""A worker process, one operator instance: python -m pddflow.runtime.workers WIRING INSTANCE"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from pddflow.core.cpu_layout import pin_self
from pddflow.runtime.wiring import Wiring


def worker_class(op_type: str) -> type:
    """The class that runs an operator type; a type without one is refused before anything runs."""
    from pddflow.runtime.workers.decoder import ColocatedWorker
    from pddflow.runtime.workers.main_decode import MainWorker
    from pddflow.runtime.workers.prefill import PrefillWorker
    from pddflow.runtime.workers.relay import RelayWorker

    roles = {
        "prefill": PrefillWorker,
        "relay_decode": RelayWorker,
        "main_decode": MainWorker,
        "decode": MainWorker,
        "colocated": ColocatedWorker,
    }
    if op_type not in roles:
        raise ValueError(
            f"operator type {op_type!r} has no worker in this runtime (it runs {', '.join(roles)})"
        )
    return roles[op_type]


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
