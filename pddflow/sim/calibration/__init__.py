"""Calibration of the simulator to this machine and its embedded deployment (docs/simulator.md).

- `bench_files.py`, `engine_fit.py`: `pddflow bench engine` files fitted as a device class;
- `serve_report.py`, `deployment.py`: what a `pddflow bench serve` report measured of each graph's
  deployment, against that fit;
- `host.py`: the host-CPU model (workers pinned to shared cores);
- `terms.py`: `Calibration`, the one frozen object a simulation applies;
- `measurements.py`: the `--calibrate` files and each graph's `Calibration` from them;
- `settle.py`: the terms that depend on the replay, settled by replaying.
"""

from pddflow.sim.calibration.bench_files import CalibrationError, is_serve_report
from pddflow.sim.calibration.engine_fit import EngineFit, calibrated_plan
from pddflow.sim.calibration.host import HostSpec
from pddflow.sim.calibration.measurements import Measurements
from pddflow.sim.calibration.settle import Settled, settle
from pddflow.sim.calibration.terms import Calibration

__all__ = [
    "Calibration",
    "CalibrationError",
    "EngineFit",
    "HostSpec",
    "Measurements",
    "Settled",
    "calibrated_plan",
    "is_serve_report",
    "settle",
]
