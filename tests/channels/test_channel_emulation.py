"""Link emulation: the token bucket and delay model on a fake clock (exact, repeatable), and a real
shaped wan_flight transfer between two processes that must land within 10% of the link's rate."""

from __future__ import annotations

import threading
import time

import pytest

from pddflow.channels.deadline import Deadline
from pddflow.channels.emulation import EmulatedLink, link_from_params
from pddflow.channels.errors import ChannelCancelled, ChannelTimeout
from pddflow.channels.wan_flight.params import WanFlightParams
from pddflow.channels.wan_flight.sender import WanFlightSender
from pddflow.core.link import Jitter, LinkModel
from pddflow.testing.peer import PeerProcess


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += max(0.0, s)


def _link(gbps=0.8, rtt_ms=20.0, jitter=Jitter(5.0, 50.0)) -> LinkModel:
    return LinkModel("A-B", "A", "B", gbps=gbps, rtt_ms=rtt_ms, jitter=jitter)


def test_token_bucket_paces_at_link_rate():
    clock = FakeClock()
    em = EmulatedLink(
        _link(rtt_ms=0, jitter=Jitter()), burst_bytes=0, clock=clock, sleep=clock.sleep
    )
    t0 = clock.t
    ready = None
    for _ in range(100):
        ready = em.hold(1_000_000, ready_at=ready)  # 100 MB at 100 MB/s
    assert clock.t - t0 == pytest.approx(1.0, rel=1e-9)


def test_one_lane_is_capped_at_the_streams_rate_and_lanes_share_the_link():
    """What one TCP stream sustains (stream_gbps) caps a lane; N lanes get N times it, up to the
    link's own rate (the simulator's per-flow cap: plan.flow_cap_gbps)."""
    from dataclasses import replace

    def seconds(lanes: int) -> float:
        clock = FakeClock()
        link = replace(_link(gbps=0.8, rtt_ms=0, jitter=Jitter()), stream_gbps=0.16)
        em = EmulatedLink(link, burst_bytes=0, clock=clock, sleep=clock.sleep)
        ready: dict[int, float] = dict.fromkeys(range(lanes), clock.t)
        last = clock.t
        for i in range(100):  # 100 MB over `lanes` backlogged lanes
            ready[i % lanes], arrival = em.schedule(1_000_000, i % lanes, ready[i % lanes])
            last = max(last, arrival)
        return last - clock.t

    assert seconds(1) == pytest.approx(5.0, rel=1e-6)  # 20 MB/s: one stream's rate
    assert seconds(4) == pytest.approx(1.25, rel=1e-2)  # 4 x 20 MB/s
    assert seconds(8) == pytest.approx(1.0, rel=1e-2)  # the link's 100 MB/s binds


def test_delay_adds_latency_not_throughput_loss():
    clock = FakeClock()
    em = EmulatedLink(
        _link(rtt_ms=200, jitter=Jitter()), burst_bytes=0, clock=clock, sleep=clock.sleep
    )
    t0 = clock.t
    ready = None
    for _ in range(100):
        ready = em.hold(1_000_000, ready_at=ready)
    assert clock.t - t0 == pytest.approx(1.0 + 0.1, rel=1e-9)  # serialisation + one one-way delay


def test_a_small_message_is_not_queued_behind_a_large_one():
    """Held messages share the bucket piece by piece (as concurrent HTTP/2 calls share a
    connection): a 100 kB message offered while an 8 MB one is being sent leaves after the large
    one's current piece, not after all of it. Deterministic: the small send runs inside the large
    send's first wait, on the same fake clock."""
    clock = FakeClock()
    small: dict[str, float] = {}

    def sleep(s: float) -> None:
        # the large send waits for its first piece to leave: the small one is offered now
        if not small:
            small["t0"] = clock.t
            em.hold(100_000, lane="small")
            small["done"] = clock.t
        clock.sleep(s)

    em = EmulatedLink(
        _link(gbps=0.8, rtt_ms=0, jitter=Jitter()), burst_bytes=0, clock=clock, sleep=sleep
    )
    t0 = clock.t
    em.hold(8_000_000, lane="large")
    rate = 0.8e9 / 8
    # behind one 256 KiB piece of the large message at most, not behind all 8 MB of it
    assert small["done"] - small["t0"] <= ((256 << 10) + 100_000) / rate + 1e-9
    assert clock.t - t0 == pytest.approx(8_100_000 / rate, rel=1e-9)  # the link stayed full


def test_arrivals_stay_in_order_per_lane_and_runs_repeat():
    def run(seed: int) -> list[float]:
        clock = FakeClock()
        em = EmulatedLink(
            _link(jitter=Jitter(5.0, 500.0)), seed=seed, clock=clock, sleep=clock.sleep
        )
        return [em.schedule(10_000, lane=i % 3)[1] for i in range(60)]

    a, b, c = run(7), run(7), run(8)
    assert a == b and a != c
    for lane in range(3):
        lane_arrivals = a[lane::3]
        assert lane_arrivals == sorted(lane_arrivals)


def test_jitter_distribution_matches_the_link_model():
    clock = FakeClock()
    link = _link(gbps=1000.0, rtt_ms=0.0, jitter=Jitter(10.0, 100.0))
    em = EmulatedLink(link, seed=3, clock=clock, sleep=clock.sleep)
    # one message per lane
    delays = sorted(em.schedule(1, lane=i)[1] - clock.t for i in range(4000))
    p50, p99 = delays[2000] * 1e3, delays[3960] * 1e3
    assert p50 == pytest.approx(10.0, rel=0.1) and p99 == pytest.approx(100.0, rel=0.25)


def test_hold_fails_at_the_deadline_when_the_link_is_too_slow():
    clock = FakeClock()
    em = EmulatedLink(_link(gbps=0.008), clock=clock, sleep=clock.sleep)  # 1 MB/s
    dl = Deadline(clock.t + 0.5, "shaped send")
    with pytest.raises(ChannelTimeout):
        em.hold(10_000_000, deadline=dl)
    assert clock.t == pytest.approx(dl.at)


def test_link_from_graph_params():
    link = link_from_params({"gbps": 100, "rtt_ms": 30, "jitter": {"p50_ms": 50, "p99_ms": 2000}})
    assert link.gbps == 100 and link.jitter.p99_ms == 2000 and link.bytes_per_s == 12.5e9


@pytest.mark.slow
def test_shaped_wan_flight_throughput_within_10_percent(kv_factory):
    """64 MiB through a 0.4 Gbps emulated link (about 1.3 s): well below what loopback carries,
    so the bucket, not the machine, sets the pace."""
    # 64 KiB blocks
    kv = kv_factory("shaped", num_blocks=1024, torch_dtype=None, layers=8, head_dim=64)
    link = LinkModel("A-B", "A", "B", gbps=0.4, rtt_ms=2.0, jitter=Jitter(0.5, 2.0))
    params = WanFlightParams(streams=4, max_batch_bytes=1 << 20, emulate=link, seed=11)
    with (
        PeerProcess("wan-recv", "--no-digest") as rx,
        WanFlightSender(rx.address, params=params) as tx,
    ):
        tx.connect(timeout_s=10)  # connections set up outside the measured transfer
        report = tx.send(kv, timeout_s=60)
        rx.line(10)
    print(f"shaped: {report.gbps:.4f} Gbps over {report.bytes} bytes in {report.seconds:.3f} s")
    assert report.gbps == pytest.approx(0.4, rel=0.10), report


def test_hold_returns_at_once_when_its_sender_aborts():
    clock = FakeClock()
    em = EmulatedLink(_link(gbps=0.008), clock=clock, sleep=clock.sleep)  # 1 MB/s
    abort = threading.Event()
    abort.set()
    em.hold(10_000_000, abort=abort)  # 10 s of link time: none of it waited
    assert clock.t == 100.0


@pytest.mark.slow
def test_closing_a_sender_ends_a_send_stuck_behind_a_slow_link(kv_factory):
    """A worker that stops closes its senders: a send that the emulated link would hold for
    minutes (one 1 MiB batch at 25 KB/s: 40 s) ends cancelled at once instead of keeping the
    process alive until its deadline."""
    kv = kv_factory("stuck", num_blocks=256, torch_dtype=None, layers=8, head_dim=64)  # 16 MiB
    link = LinkModel("A-B", "A", "B", gbps=0.0002, rtt_ms=2.0, jitter=Jitter(0.5, 2.0))
    params = WanFlightParams(streams=2, max_batch_bytes=1 << 20, emulate=link)
    outcome: list[BaseException | None] = []

    def send() -> None:
        try:
            tx.send(kv, timeout_s=300)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    with PeerProcess("wan-recv", "--no-digest") as rx:
        tx = WanFlightSender(rx.address, params=params)
        tx.connect(timeout_s=10)
        sending = threading.Thread(target=send)
        sending.start()
        time.sleep(0.5)  # the first batches are out, the link holds the rest
        tx.close()
        sending.join(timeout=30)
    assert not sending.is_alive() and isinstance(outcome[0], ChannelCancelled), outcome
