"""Link emulation: a real channel on one machine shaped like the WAN of a `LinkModel`, a token
bucket shared by the link's lanes, one per lane at the link's `stream_gbps` (what one TCP stream
sustains over the RTT: a transfer over N streams gets at most N x it, as the simulator's flows),
plus a seeded one-way delay per message (docs/channels.md).

Per message on lane k: arrival = max(previous arrival on k, departure + rtt/2 + jitter). Holding
each message until its arrival, not sleeping between sends, keeps the link pipelined."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from pddflow.channels.deadline import Deadline
from pddflow.core.link import Jitter, LinkModel, jitter_stream

SHARE_BYTES = 256 << 10  # a held message takes the bucket this much at a time
DEFAULT_TAIL = 40.0  # P99/P50 of PDD's measured KV jitter (50 ms / 2 s), for a link declared flat


@dataclass
class LinkStats:
    messages: int = 0
    bytes: int = 0
    delay_s: float = 0.0


class EmulatedLink:
    """One direction of `link`, shaping real sends. Thread-safe; lanes share the bandwidth."""

    def __init__(
        self,
        link: LinkModel,
        seed: int = 0,
        burst_bytes: int = 64 << 10,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if link.gbps <= 0:
            raise ValueError(f"link {link.name!r}: gbps must be > 0 to emulate it")
        self.link = link
        self.seed = seed
        self.burst_bytes = burst_bytes
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._tat = float("-inf")  # theoretical arrival time of the bucket (GCRA)
        self._lane_tat: dict[int | str, float] = {}  # each lane's own bucket (stream_gbps)
        self._set_rates(link)
        self._last_arrival: dict[int | str, float] = {}
        self._rngs: dict[int | str, random.Random] = {}  # per jitter stream (a TCP connection)
        self.stats = LinkStats()

    def schedule(
        self,
        nbytes: int,
        lane: int | str = 0,
        ready_at: float | None = None,
        jitter_lane: int | str | None = None,
    ) -> tuple[float, float]:
        """Emulated (departure, arrival). A backlogged sender passes the previous message's
        departure as ready_at: it would have handed this one to the NIC then."""
        with self._lock:
            depart = self._reserve(nbytes, ready_at, lane)
            return depart, self._deliver(nbytes, lane, depart, jitter_lane)

    def hold(
        self,
        nbytes: int,
        lane: int | str = 0,
        deadline: Deadline | None = None,
        ready_at: float | None = None,
        jitter_lane: int | str | None = None,
        abort: threading.Event | None = None,
    ) -> float:
        """Block until nbytes arrive, taking the bucket SHARE_BYTES at a time so concurrent
        messages interleave as HTTP/2 calls do; returns the departure (the next ready_at).
        `jitter_lane` continues a connection's delay samples across its calls. Returns at once
        when `abort` is set: a sender that is closing does not wait out a slow link."""
        left, offered = nbytes, ready_at
        while abort is None or not abort.is_set():
            piece = min(left, SHARE_BYTES)
            left -= piece
            with self._lock:
                depart = self._reserve(piece, offered, lane)
                arrival = self._deliver(nbytes, lane, depart, jitter_lane) if left <= 0 else depart
            if left <= 0:
                break
            # others may take the next piece
            self.wait_until(depart, deadline, f"{nbytes} bytes", abort)
            offered = depart  # backlogged: the next piece was ready when this one left
        else:
            return self._clock()
        self.wait_until(arrival, deadline, f"{nbytes} bytes", abort)
        return depart

    def retune(self, link: LinkModel) -> None:
        """Shape by `link` from now on (the admin endpoint's degrade and restore): a piece already
        reserved keeps its time (at most SHARE_BYTES per sender), every later one goes at the new
        rate and draws the new delay, so a transfer in flight goes on at it from its next piece."""
        if link.gbps <= 0:
            raise ValueError(f"link {link.name!r}: gbps must be > 0 to emulate it")
        with self._lock:
            self._set_rates(link)

    def _set_rates(self, link: LinkModel) -> None:
        self.link, self.rate = link, link.bytes_per_s
        self.burst_s = self.burst_bytes / self.rate
        self.lane_rate = link.stream_gbps * 1e9 / 8 if link.stream_gbps > 0 else 0.0

    def end_lane(self, lane: int | str) -> None:
        with self._lock:
            self._last_arrival.pop(lane, None)
            self._lane_tat.pop(lane, None)

    def _reserve(self, nbytes: int, ready_at: float | None, lane: int | str | None = None) -> float:
        now = self._clock()
        offered = now if ready_at is None else min(now, ready_at)
        # GCRA: a message may leave once tat - burst is not in the future
        tat = max(self._tat, offered) + nbytes / self.rate
        self._tat = tat
        depart = max(offered, tat - self.burst_s)
        if lane is not None and self.lane_rate:  # and within its own stream's rate
            lane_tat = max(self._lane_tat.get(lane, float("-inf")), offered)
            lane_tat += nbytes / self.lane_rate
            self._lane_tat[lane] = lane_tat
            depart = max(depart, lane_tat - self.burst_bytes / self.lane_rate)
        return depart

    def _deliver(
        self, nbytes: int, lane: int | str, depart: float, jitter_lane: int | str | None = None
    ) -> float:
        rng = self._rng(lane if jitter_lane is None else jitter_lane)
        delay = self.link.rtt_ms / 2e3 + self.link.jitter.sample_ms(rng) / 1e3
        arrival = max(self._last_arrival.get(lane, 0.0), depart + delay)
        self._last_arrival[lane] = arrival
        self.stats.messages += 1
        self.stats.bytes += nbytes
        self.stats.delay_s += delay
        return arrival

    def _rng(self, key: int | str) -> random.Random:
        rng = self._rngs.get(key)
        if rng is None:  # str seeds are hashed deterministically (sha512)
            rng = self._rngs[key] = jitter_stream(self.seed, key)
        return rng

    def wait_until(
        self,
        arrival: float,
        deadline: Deadline | None = None,
        what: str = "a message",
        abort: threading.Event | None = None,
    ) -> None:
        sleep = self._sleep if abort is None else abort.wait
        if deadline is not None and arrival > deadline.at:
            sleep(max(0.0, deadline.at - self._clock()))
            if abort is not None and abort.is_set():
                return
            raise deadline.timeout(
                f"emulated link {self.link.name!r} cannot deliver {what} in time"
            )
        wait = arrival - self._clock()
        if wait > 0:
            sleep(wait)

    def return_delay(self, lane: int = 0) -> float:
        """An ack's delay, from its own stream so the forward samples do not depend on it."""
        with self._lock:
            return self.link.rtt_ms / 2e3 + self.link.jitter.sample_ms(self._rng(-1 - lane)) / 1e3


def degraded(link: LinkModel, gbps: float, jitter_p99_ms: float | None = None) -> LinkModel:
    """`link` at `gbps`, its RTT as declared. With `jitter_p99_ms`, the jitter is rescaled so its
    P99 is that: the declared distribution and tail (P99/P50) kept, so a lognormal stays as heavy
    tailed as declared; a link declared without a tail gets PDD's (P99 = 40 x P50, lognormal)."""
    if gbps <= 0:
        raise ValueError(f"link {link.name!r}: gbps must be > 0, got {gbps:g}")
    if jitter_p99_ms is None:
        return replace(link, gbps=gbps)
    if jitter_p99_ms < 0:
        raise ValueError(f"link {link.name!r}: jitter P99 must be >= 0 ms, got {jitter_p99_ms:g}")
    j = link.jitter
    if jitter_p99_ms == 0:
        jitter = Jitter()
    elif j.dist == "constant":
        jitter = Jitter(p50_ms=jitter_p99_ms, p99_ms=jitter_p99_ms, dist="constant")
    elif j.p50_ms > 0 and j.p99_ms > j.p50_ms:
        jitter = Jitter(jitter_p99_ms * j.p50_ms / j.p99_ms, jitter_p99_ms, j.dist)
    else:
        jitter = Jitter(jitter_p99_ms / DEFAULT_TAIL, jitter_p99_ms, "lognormal")
    return replace(link, gbps=gbps, jitter=jitter)


def link_from_params(params: dict | LinkModel | None, name: str = "emulated") -> LinkModel | None:
    if params is None or isinstance(params, LinkModel):
        return params
    jit = params.get("jitter") or {}
    return LinkModel(
        name=str(params.get("name", name)),
        a=str(params.get("a", "A")),
        b=str(params.get("b", "B")),
        gbps=float(params["gbps"]),
        rtt_ms=float(params.get("rtt_ms", 0.0)),
        jitter=Jitter(**jit) if isinstance(jit, dict) else jit,
    )
