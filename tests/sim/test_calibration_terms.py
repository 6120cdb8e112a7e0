"""What each term of a `Calibration` does to a replay of `bench serve`'s workload: each one alone,
against the same replay without it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pddflow.core.serve_sessions import build
from pddflow.graph import load_plan
from pddflow.sim.calibration import Calibration
from pddflow.sim.run import LegState
from pddflow.sim.serve_replay import replay, serve_workload
from pddflow.sim.simulator import Simulation

ROOT = Path(__file__).resolve().parents[2]


def _plan(wan_gbps: float | None = None):
    plan = load_plan(str(ROOT / "graphs" / "pdd.yaml")).scaled_to_local()
    if wan_gbps is not None:  # a slow WAN: requests take the relay
        plan = replace(plan, links={n: replace(lk, gbps=wan_gbps) for n, lk in plan.links.items()})
    return plan


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
        runs = sorted(_replay(plan, wl, seed, prefill_spread=spread).runs, key=lambda r: r.req.rid)
        return [r.prefill_done_at - r.prefill_started_at for r in runs]

    base, doubled = prefills(()), prefills((2.0,))
    assert doubled == pytest.approx([2 * x for x in base], rel=1e-9)
    spread = (0.8, 1.0, 1.6)
    assert prefills(spread, 3) == prefills(spread, 3) != prefills(spread, 4)


def test_relay_handover_is_drawn_per_request(serve_trace):
    """With measured handovers the relay holds a prefill's KV that long after the prefill ends
    (instead of the RDMA model's microseconds), and shows its first token no earlier; a prefill
    that queued draws from the handovers measured after queued prefills."""
    plan = _plan(wan_gbps=0.05)
    wl = serve_workload(serve_trace, 3, 2, plan.model.block_size, seed=0, rps=2.0, think_s=1.0)
    sim = _replay(plan, wl, relay_handovers=(0.25,))
    relayed = [r for r in sim.runs if r.relay.state is not LegState.NONE]
    assert relayed and all(r.first_token_at - r.prefill_done_at >= 0.25 - 1e-9 for r in relayed)
    busy = _replay(
        plan,
        serve_workload(serve_trace, 4, 2, plan.model.block_size, seed=0, rps=1000.0, think_s=1.0),
        prefill_spread=(10.0,),  # slow prefills: a queue
        relay_handovers=(0.01, 0.4),
        relay_handovers_queued=(0.4,),
    )
    relayed = [r for r in busy.runs if r.relay.state is not LegState.NONE]
    queued = [r.prefill_started_at - r.arrival >= 0.05 for r in relayed]
    assert any(queued) and not all(queued)
    for r, q in zip(relayed, queued):
        assert (r.first_token_at - r.prefill_done_at >= 0.4 - 1e-9) == q


def test_prefill_shipping_holds_the_prefill_engine(serve_trace):
    """A prefill worker exports each prompt's KV before it starts the next: no prefill starts
    within the drawn shipping time (per byte, times the bytes it sends) of the previous one's
    end."""
    plan = _plan()
    wl = serve_workload(serve_trace, 4, 2, plan.model.block_size, seed=0, rps=20.0, think_s=1.0)

    def prefills(shipping: tuple[float, ...]) -> list[tuple[float, float, float, float]]:
        runs = _replay(plan, wl, prefill_shipping=shipping).runs
        return sorted(
            (r.prefill_started_at, r.prefill_done_at, r.prefill.shipping_s, r.finisher.bytes)
            for r in runs
        )

    rate = 20e-9  # 20 ms per MB
    shipped = prefills((rate,))
    # at least the finisher's copy
    assert all(a[2] > 0 and a[2] >= rate * a[3] - 1e-12 for a in shipped)
    assert all(b[0] >= a[1] + a[2] - 1e-9 for a, b in zip(shipped, shipped[1:]))
    plain = prefills(())
    # without it they do queue back to back
    assert any(b[0] < a[1] + s[2] for a, b, s in zip(plain, plain[1:], shipped))


def test_serving_latency_counts_from_the_send(serve_trace):
    """The serving path (client -> frontend -> prefill worker, first token back): a request enters
    the deployment that long after its session sent it, and its TTFT and end count from the send;
    with one session nothing else moves, so every TTFT grows by it."""
    spec = build(serve_trace, 1, 3, 1 / 32, vocab=256)
    plan = _plan()
    wl = replay(spec, plan.model.block_size)
    a, b = _replay(plan, wl).runs, _replay(plan, wl, serving_latency_s=0.02).runs
    assert [r.req.rid for r in a] == [r.req.rid for r in b]
    assert all(r.done and not r.failed for r in a + b)
    for x, y in zip(a, b):
        assert (y.first_token_at - y.arrival) - (x.first_token_at - x.arrival) == pytest.approx(
            0.02, abs=1e-9
        )
        assert y.prefill_started_at - y.arrival == pytest.approx(
            x.prefill_started_at - x.arrival + 0.02, abs=1e-9
        )
    # the closed loop: each later turn is sent a think time after the client saw the last token
    assert b[-1].arrival - a[-1].arrival == pytest.approx(2 * 0.02, abs=1e-9)
