"""A link degraded in place (the admin endpoint's degrade and restore): a transfer in flight goes
on at the new rate from its next piece, later messages draw the new delay, and the degraded model
keeps the declared RTT and jitter shape. On a fake clock: exact and repeatable."""

from __future__ import annotations

import pytest

from pddflow.channels.emulation import DEFAULT_TAIL, SHARE_BYTES, EmulatedLink, degraded
from pddflow.core.link import Jitter, LinkModel


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += max(0.0, s)


def _link(gbps: float = 0.8, rtt_ms: float = 0.0, jitter: Jitter = Jitter()) -> LinkModel:
    return LinkModel("A-B", "A", "B", gbps=gbps, rtt_ms=rtt_ms, jitter=jitter)


def test_a_transfer_in_flight_goes_on_at_the_new_rate():
    """100 MB at 100 MB/s, slowed to 10 MB/s once half has left: the other half takes 5 s, less
    the one piece reserved at the old rate."""
    clock = FakeClock()
    t0 = clock.t

    def sleep(s: float) -> None:
        if em.rate > 50e6 and clock.t - t0 >= 0.5:  # on the sender's thread, between pieces
            em.retune(_link(gbps=0.08))
        clock.sleep(s)

    em = EmulatedLink(_link(gbps=0.8), burst_bytes=0, clock=clock, sleep=sleep)
    em.hold(100_000_000)
    piece_gap = SHARE_BYTES / 10e6 - SHARE_BYTES / 100e6
    assert clock.t - t0 == pytest.approx(0.5 + 5.0 - piece_gap, abs=2 * SHARE_BYTES / 10e6)
    assert em.link.gbps == 0.08


def test_restore_brings_the_declared_rate_and_delay_back():
    clock = FakeClock()
    declared = _link(gbps=0.8, rtt_ms=20.0, jitter=Jitter(5.0, 5.0, "constant"))
    em = EmulatedLink(declared, burst_bytes=0, clock=clock, sleep=clock.sleep)
    depart, arrival = em.schedule(1_000, lane=0)
    assert arrival - depart == pytest.approx(0.010 + 0.005)
    em.retune(degraded(declared, 0.008, jitter_p99_ms=500.0))
    clock.t += 10.0
    depart, arrival = em.schedule(1_000_000, lane=1)  # 1 MB at 1 MB/s, then the new delay
    assert depart - clock.t == pytest.approx(1.0)
    assert arrival - depart == pytest.approx(0.010 + 0.500)
    em.retune(declared)
    clock.t += 10.0
    depart, arrival = em.schedule(1_000_000, lane=2)
    assert depart - clock.t == pytest.approx(0.01)
    assert arrival - depart == pytest.approx(0.010 + 0.005)


def test_degraded_model_keeps_rtt_and_jitter_shape():
    declared = _link(gbps=100, rtt_ms=30, jitter=Jitter(50.0, 2000.0, "lognormal"))
    slow = degraded(declared, 0.01)
    assert (slow.gbps, slow.rtt_ms, slow.jitter) == (0.01, 30, declared.jitter)
    tail = degraded(declared, 0.01, jitter_p99_ms=400.0)
    assert tail.jitter == Jitter(10.0, 400.0, "lognormal")  # P99/P50 = 40, as declared
    assert tail.jitter.quantile_ms(0.99) == pytest.approx(400.0)
    assert degraded(declared, 1.0, jitter_p99_ms=0).jitter == Jitter()
    flat = _link(jitter=Jitter())
    assert degraded(flat, 1.0, 80.0).jitter == Jitter(80.0 / DEFAULT_TAIL, 80.0, "lognormal")
    const = _link(jitter=Jitter(5.0, 5.0, "constant"))
    assert degraded(const, 1.0, 80.0).jitter == Jitter(80.0, 80.0, "constant")
    normal = _link(jitter=Jitter(10.0, 30.0, "normal"))
    assert degraded(normal, 1.0, 60.0).jitter == Jitter(20.0, 60.0, "normal")


@pytest.mark.parametrize("gbps, p99", [(0.0, None), (-1.0, None), (1.0, -5.0)])
def test_degraded_refuses_what_cannot_shape_a_link(gbps, p99):
    with pytest.raises(ValueError, match="A-B"):
        degraded(_link(), gbps, p99)
