"""The cluster-scale discrete-event simulator (`pddflow simulate`); see docs/simulator.md.

    wl = load_trace(path) or generate(AgenticConfig(...))
    sim = Simulation(plan, wl, seed=0); sim.run()
    report = summarize(sim)

Pure Python: numpy and matplotlib are imported only by `plots.py`.
"""

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
