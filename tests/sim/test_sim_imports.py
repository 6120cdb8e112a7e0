"""The scheduler and the simulator stay pure Python: no torch, pyarrow, grpc (or numpy/matplotlib
before --plot), so `pddflow simulate` starts fast and the runtime can import the scheduler
cheaply."""

from __future__ import annotations

import pytest

from pddflow.testing.imports import HEAVY, heavy_after


@pytest.mark.slow
def test_scheduler_and_simulator_imports_are_light():
    code = (
        "import pddflow.scheduler, pddflow.sim.simulator, pddflow.sim.metrics, "
        "pddflow.commands.sim_cmds"
    )
    assert heavy_after(code, (*HEAVY, "numpy", "matplotlib")) == set()
