"""Prefill wall factors, settled by replaying: what the host model leaves unexplained depends on
them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pddflow.sim.calibration.terms import Calibration
from pddflow.sim.engine import StepKind

if TYPE_CHECKING:
    from pddflow.sim.simulator import Simulation

ROUNDS = 6  # replays at most
TOLERANCE = 0.02  # ... until no factor moves more than this share between two replays
WALL_FACTOR_BOUNDS = (0.5, 3.0)


@dataclass(frozen=True)
class Settled:
    simulation: Simulation  # the last replay, run with `calibration`
    calibration: Calibration


def settle(cal: Calibration, replay: Callable[[Calibration], Simulation]) -> Settled:
    """Replay until each prefill instance's factor stops moving (a wall factor needs the host
    model: without it, one replay)."""
    host = cal.host
    target = cal.prefill_wall_over_cpu if host is not None else {}
    walls: Mapping[str, float] = {}
    rounds = 0
    while True:
        current = cal if host is None else replace(cal, host=replace(host, prefill_wall=walls))
        sim = replay(current)
        rounds += 1
        want = wall_factors(sim, target, walls)
        settled = all(abs(f - walls.get(i, 1.0)) <= TOLERANCE * f for i, f in want.items())
        if settled or rounds >= ROUNDS:
            return Settled(sim, current)
        walls = want


def wall_factors(
    sim: Simulation, measured: Mapping[str, float], current: Mapping[str, float]
) -> dict[str, float]:
    """Per instance, the factor that brings this replay's wall over model time of prefill steps
    to the measured wall over CPU (the worker's other threads, the frontend, the loop's own
    work)."""
    lo, hi = WALL_FACTOR_BOUNDS
    out = dict(current)
    for inst, ratio in measured.items():
        engine = sim.engines.get(inst)
        simulated = engine.wall_over_model(StepKind.PREFILL) if engine is not None else None
        if simulated is None:
            continue
        out[inst] = min(hi, max(lo, current.get(inst, 1.0) * ratio / simulated))
    return out
