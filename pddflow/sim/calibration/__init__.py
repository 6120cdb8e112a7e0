"""Calibration of the simulator to this machine and its deployment (docs/simulator.md)."""

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
