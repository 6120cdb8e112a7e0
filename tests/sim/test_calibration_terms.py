"""What each term of a `Calibration` does to a replay of `bench serve`'s workload: each one alone,
against the same replay without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pddflow.graph import load_plan
from pddflow.sim.calibration import Calibration
from pddflow.sim.serve_replay import serve_workload
from pddflow.sim.simulator import Simulation

ROOT = Path(__file__).resolve().parents[2]


def _plan():
    return load_plan(str(ROOT / "graphs" / "pdd.yaml")).scaled_to_local()


def _replay(plan, wl, seed: int = 0, **terms) -> Simulation:
    sim = Simulation(plan, wl, seed=seed, embedded=True, calibration=Calibration(**terms))
    sim.run()
    return sim


def test_prefill_spread_is_drawn_per_prefill(serve_trace):
    """Each prefill costs the model x a factor drawn from the measured spread (seeded): a spread of
    only 2.0 doubles every prefill; the draws repeat with the seed."""
    plan = _plan()
    wl = serve_workload(serve_trace, 3, 2, plan.model.block_size, seed=0, rps=2.0, think_s=1.0)

    def prefills(spread: tuple[float, ...], seed: int = 0) -> list[float]:
        flights = sorted(
            _replay(plan, wl, seed, prefill_spread=spread).flights, key=lambda r: r.req.rid
        )
        return [r.prefill_done_at - r.prefill_started_at for r in flights]

    base, doubled = prefills(()), prefills((2.0,))
    assert doubled == pytest.approx([2 * x for x in base], rel=1e-9)
    spread = (0.8, 1.0, 1.6)
    assert prefills(spread, 3) == prefills(spread, 3) != prefills(spread, 4)


def test_prefill_shipping_holds_the_prefill_engine(serve_trace):
    """A prefill worker exports each prompt's KV before it starts the next: no prefill starts
    within the drawn shipping time (per byte, times the bytes it sends) of the previous one's
    end."""
    plan = _plan()
    wl = serve_workload(serve_trace, 4, 2, plan.model.block_size, seed=0, rps=20.0, think_s=1.0)

    def prefills(shipping: tuple[float, ...]) -> list[tuple[float, float, float, float]]:
        flights = _replay(plan, wl, prefill_shipping=shipping).flights
        return sorted(
            (r.prefill_started_at, r.prefill_done_at, r.prefill.shipping_s, r.main.bytes)
            for r in flights
        )

    rate = 20e-9  # 20 ms per MB
    shipped = prefills((rate,))
    # at least main's copy
    assert all(a[2] > 0 and a[2] >= rate * a[3] - 1e-12 for a in shipped)
    assert all(b[0] >= a[1] + a[2] - 1e-9 for a, b in zip(shipped, shipped[1:]))
    plain = prefills(())
    # without it they do queue back to back
    assert any(b[0] < a[1] + s[2] for a, b, s in zip(plain, plain[1:], shipped))
