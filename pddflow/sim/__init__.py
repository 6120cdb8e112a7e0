"""The discrete-event simulator of `pddflow simulate` (docs/simulator.md). Pure Python: numpy and
matplotlib are imported only by `plots.py`."""

from pddflow.sim.agentic import AgenticConfig, generate
from pddflow.sim.metrics import summarize
from pddflow.sim.simulator import Simulation
from pddflow.sim.trace import TraceError, load_trace
from pddflow.sim.workload import SimRequest, Workload

__all__ = [
    "AgenticConfig",
    "SimRequest",
    "Simulation",
    "TraceError",
    "Workload",
    "generate",
    "load_trace",
    "summarize",
]
