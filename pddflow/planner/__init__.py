"""The planner: pools follow the load (docs/runtime.md, The planner).

- `policy.py`: one pool's load and a replica's capacity in, a replica count and its reason out;
- `capacity.py`: a replica's capacity within the SLA, from the device model or from measurements;
- `meter.py`: the load, measured over a sliding window the same way by the runtime and simulator.
"""

from pddflow.planner.meter import Meter
from pddflow.planner.policy import (
    Planner,
    PlannerConfig,
    PoolDecision,
    PoolLoad,
    direction_changes,
)

__all__ = ["Meter", "Planner", "PlannerConfig", "PoolDecision", "PoolLoad", "direction_changes"]
