"""Terms that depend on the replay itself, settled by replaying: the serving path's load follows the
replay's token rate, which follows the load; a wall factor is the part of the measured wall over
CPU that the host model does not explain in this replay. Each replay of a serve workload takes
well under a second; a few settle them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pddflow.sim.calibration.terms import Calibration
from pddflow.sim.engine import StepKind

if TYPE_CHECKING:
    from pddflow.sim.simulator import Simulation

ROUNDS = 6  # replays at most
TOLERANCE = 0.02  # ... until no term moves more than this share between two replays
WALL_FACTOR_BOUNDS = (0.5, 3.0)


@dataclass(frozen=True)
class Settled:
    simulation: Simulation  # the last replay, run with `calibration`
    calibration: Calibration
    replays: int


def settle(cal: Calibration, replay: Callable[[Calibration], Simulation]) -> Settled:
    """Replay (`replay(cal)` runs one simulation) until the serving load and every wall factor
    move less than TOLERANCE, or ROUNDS times."""
    host = cal.host
    targets = {  # (a wall factor needs the host model)
        StepKind.DECODE: cal.decode_wall_over_cpu if host is not None else {},
        StepKind.PREFILL: cal.prefill_wall_over_cpu if host is not None else {},
    }
    serving = 0.0
    walls: dict[StepKind, Mapping[str, float]] = {StepKind.DECODE: {}, StepKind.PREFILL: {}}
    rounds = 0
    while True:
        current = cal
        if host is not None:
            current = replace(
                cal,
                host=replace(
                    host,
                    serving_cores=serving,
                    decode_wall=walls[StepKind.DECODE],
                    prefill_wall=walls[StepKind.PREFILL],
                ),
            )
        sim = replay(current)
        rounds += 1
        per_token = cal.serving_cpu_per_token_s
        want = serving_load(sim, per_token) if host is not None and per_token else 0.0
        want_walls = {k: wall_factors(sim, k, targets[k], walls[k]) for k in walls}
        settled = abs(want - serving) <= TOLERANCE * max(want, 1e-9) and all(
            abs(f - walls[k].get(i, 1.0)) <= TOLERANCE * f
            for k in walls
            for i, f in want_walls[k].items()
        )
        if settled or rounds >= ROUNDS:
            return Settled(sim, current, rounds)
        serving, walls = want, want_walls


def serving_load(sim: Simulation, cpu_per_token_s: float) -> float:
    """Cores' worth of CPU the frontend and the client take in this replay: its output tokens per
    second, first arrival to last finish, times their CPU per token."""
    done = [r for r in sim.runs if r.done and not r.failed]
    if not done or cpu_per_token_s <= 0:
        return 0.0
    span = max(r.finished_at for r in done) - min(r.arrival for r in sim.runs)
    return sum(r.req.output_tokens for r in done) / max(span, 1e-9) * cpu_per_token_s


def wall_factors(
    sim: Simulation, kind: StepKind, measured: Mapping[str, float], current: Mapping[str, float]
) -> dict[str, float]:
    """Per instance, the factor on its `kind` steps that brings this replay's wall over model time
    of those steps to the deployment's measured wall over CPU: the host model explains part of it
    (cores shared with other workers), the factor the rest (the worker's other threads, the
    frontend and client on its cores, the loop's own work between steps)."""
    lo, hi = WALL_FACTOR_BOUNDS
    out = dict(current)
    for inst, ratio in measured.items():
        engine = sim.engines.get(inst)
        simulated = engine.wall_over_model(kind) if engine is not None else None
        if simulated is None:
            continue
        out[inst] = min(hi, max(lo, current.get(inst, 1.0) * ratio / simulated))
    return out
