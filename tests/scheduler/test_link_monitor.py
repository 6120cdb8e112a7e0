"""A link's estimate follows what its transfers measure, shared with the flows in flight, and
decays back to the graph's model when nothing crosses it."""

from __future__ import annotations

import math

import pytest

from pddflow.core.link import LinkModel
from pddflow.scheduler.link_monitor import (
    HALF_LIFE_S,
    IN_FLIGHT_MAX_S,
    MIN_RATE_BYTES,
    LinkMonitor,
)

MODEL = LinkModel("A-B", "A", "B", gbps=0.8, rtt_ms=20)  # 100 MB/s


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _transfer(m: LinkMonitor, key: str, nbytes: float, seconds: float) -> None:
    m.started(key)
    m.ended(key, nbytes, seconds)


def test_nothing_measured_is_the_model():
    m = LinkMonitor(MODEL, Clock())
    assert m.link_bytes_per_s() == pytest.approx(100e6)
    assert m.transfer_p90_s() is None
    assert m.estimate().bytes_per_s == pytest.approx(100e6)


def test_a_degraded_link_is_seen_at_once_and_recovers_to_the_model():
    clock = Clock()
    m = LinkMonitor(MODEL, clock)
    _transfer(m, "t1", 10e6, 1.02)  # 10 MB in 1 s of moving: 10 MB/s, a tenth of the model
    # averaged as logs: the slow measurement is barely diluted by the model's rate
    assert m.link_bytes_per_s() == pytest.approx(
        math.exp((math.log(10e6) + 0.05 * math.log(100e6)) / 1.05)
    )
    assert m.link_bytes_per_s() < 11.2e6
    assert m.report()["estimated_gbps"] == pytest.approx(m.link_bytes_per_s() * 8 / 1e9, rel=1e-4)
    clock.t = 20 * HALF_LIFE_S  # a long silence: the measurement has faded
    assert m.link_bytes_per_s() == pytest.approx(100e6, rel=0.02)
    _transfer(m, "t2", 50e6, 0.52)  # recovered: 100 MB/s measured again
    assert m.link_bytes_per_s() == pytest.approx(100e6, rel=0.02)


def test_flows_in_flight_share_the_link():
    m = LinkMonitor(MODEL, Clock())
    m.started("a")
    m.started("b")
    assert m.estimate().bytes_per_s == pytest.approx(100e6 / 3)
    m.ended("a", 5e6, 0.02 + 0.1)  # 50 MB/s for a flow that shared the link with one other
    assert m.link_bytes_per_s() == pytest.approx(100e6)  # 2 x 50 MB/s: the model's rate
    m.ended("b", None, None)  # a failed transfer frees its slot and measures nothing
    assert m.estimate().active_flows == 0 and len(m.rates) == 1


def test_small_transfers_time_the_link_but_do_not_rate_it():
    m = LinkMonitor(MODEL, Clock())
    for i in range(10):
        _transfer(m, i, MIN_RATE_BYTES / 4, 0.02 + 0.01 * i)
    assert len(m.rates) == 0 and m.link_bytes_per_s() == pytest.approx(100e6)
    assert m.transfer_p90_s() == pytest.approx(0.02 + 0.081, rel=1e-6)


def test_transfers_of_a_lost_sender_stop_counting():
    clock = Clock()
    m = LinkMonitor(MODEL, clock)
    m.started(("r1", "prefill/0", "main/0"))
    m.started(("r2", "prefill/1", "main/0"))
    m.forget(lambda t: "prefill/0" in t[1:])
    assert m.estimate().active_flows == 1
    clock.t = IN_FLIGHT_MAX_S + 1  # nor does one that never ended, after the longest deadline
    assert m.estimate().active_flows == 0


def test_a_transfer_that_overstays_slows_the_estimate_before_it_ends():
    clock = Clock()
    m = LinkMonitor(MODEL, clock)
    m.started("big", 10e6)  # 10 MB: 0.1 s at the model's 100 MB/s
    clock.t = 0.05
    assert m.link_bytes_per_s() == pytest.approx(100e6)  # not overdue yet
    clock.t = 2.02  # still crossing after 2 s of moving (RTT 20 ms): at most 5 MB/s
    assert m.link_bytes_per_s() == pytest.approx(10e6 / 2.0)
    m.ended("big", 10e6, 2.02)
    assert m.link_bytes_per_s() == pytest.approx(
        math.exp((math.log(5e6) + 0.05 * math.log(100e6)) / 1.05)
    )


def test_a_recovered_link_is_seen_within_a_few_transfers():
    clock = Clock()
    m = LinkMonitor(MODEL, clock)
    _transfer(m, "slow", 1e6, 1.02)  # 1 MB/s: a hundredth of the model
    for i in range(3):
        clock.t += 1.0
        _transfer(m, f"fast{i}", 50e6, 0.52)  # 100 MB/s again
    assert m.link_bytes_per_s() > 25e6  # within 4x of the recovered rate after three transfers
