"""The scheduler and the simulator stay pure Python: no torch, pyarrow, grpc (or numpy/matplotlib
before --plot), so `pddflow simulate` starts fast and the runtime can import the scheduler
cheaply."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "pyarrow", "grpc", "numpy", "matplotlib")


@pytest.mark.slow
def test_scheduler_and_simulator_imports_are_light():
    code = (
        "import sys\nimport pddflow.scheduler, pddflow.sim.simulator, pddflow.sim.metrics, "
        "pddflow.commands.sim_cmds\n"
        f"print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == ""
