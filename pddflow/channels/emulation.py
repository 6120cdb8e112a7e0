"""Link emulation: make a real wan_flight or token_ids channel on one machine behave like the WAN
between two datacenters, using the graph's `pddflow.core.link.LinkModel`.

An end shapes what it sends (a link is two directions; token_ids gives each end the LinkModel and
a different seed; a wan_flight sender shapes its data and adds the return delay of the final
acknowledgement, since the KV flows one way). Per message of n bytes on lane k (a lane is one
TCP stream: messages on it stay in order):

    departure  token bucket at link.gbps, depth burst_bytes, shared by every lane of the link
               (a backlogged lane offers its next message when the previous one departed)
    arrival    max(previous arrival on lane k, departure + rtt/2 + jitter sample)

and the sender holds the message until its arrival time, then writes it to the real socket (on
loopback the write itself takes microseconds). Holding, not sleeping between sends, keeps the
link pipelined: delay adds latency, the bucket alone bounds throughput. Jitter is drawn from the
link's distribution with a random.Random seeded by (seed, lane), so a run repeats.

`hold` reserves the bucket SHARE_BYTES at a time, waiting for each piece's departure before
reserving the next, so concurrent messages interleave on the link the way frames of concurrent
HTTP/2 calls share a connection (and TCP flows share a path): a warm turn's 1 MB transfer is not
queued behind a cold turn's whole 8 MiB batch. A wan_flight sender gives every call its own lane,
so only one call's messages stay in order behind each other; delays are drawn per `jitter_lane`
(its stream: one connection's seeded sequence, continued across calls).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pddflow.channels.deadline import Deadline
from pddflow.core.link import LinkModel, jitter_stream

SHARE_BYTES = 256 << 10  # a held message takes the bucket this much at a time


@dataclass
class LinkStats:
    messages: int = 0
    bytes: int = 0
    delay_s: float = 0.0  # sum of sampled one-way delays


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
        self.rate = link.bytes_per_s
        self.burst_s = burst_bytes / self.rate
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._tat = float("-inf")  # theoretical arrival time of the bucket (GCRA)
        self._last_arrival: dict[int | str, float] = {}  # per lane: its messages arrive in order
        self._rngs: dict[int | str, random.Random] = {}  # per jitter stream (a TCP connection)
        self.stats = LinkStats()

    def schedule(
        self,
        nbytes: int,
        lane: int | str = 0,
        ready_at: float | None = None,
        jitter_lane: int | str | None = None,
    ) -> tuple[float, float]:
        """Reserve the link for nbytes offered on `lane` at ready_at (default now); return the
        emulated (departure, arrival) times in clock units.

        A backlogged sender passes the previous message's departure as ready_at: it would have
        handed this message to the NIC then, not after waiting out the previous one's delay."""
        with self._lock:
            depart = self._reserve(nbytes, ready_at)
            return depart, self._deliver(nbytes, lane, depart, jitter_lane)

    def hold(
        self,
        nbytes: int,
        lane: int | str = 0,
        deadline: Deadline | None = None,
        ready_at: float | None = None,
        jitter_lane: int | str | None = None,
    ) -> float:
        """Schedule nbytes, sharing the bucket piece by piece with concurrent messages, and block
        until they arrive; returns the departure time, to pass as the next message's ready_at
        when the sender is backlogged. `jitter_lane` (default: `lane`) names the random stream
        the delay is drawn from, so a connection's samples continue across its calls."""
        left, offered = nbytes, ready_at
        while True:
            piece = min(left, SHARE_BYTES)
            left -= piece
            with self._lock:
                depart = self._reserve(piece, offered)
                arrival = self._deliver(nbytes, lane, depart, jitter_lane) if left <= 0 else depart
            if left <= 0:
                break
            self.wait_until(depart, deadline, f"{nbytes} bytes")  # others may take the next piece
            offered = depart  # backlogged: the next piece was ready when this one left
        self.wait_until(arrival, deadline, f"{nbytes} bytes")
        return depart

    def end_lane(self, lane: int | str) -> None:
        """Forget a lane's ordering (a finished call)."""
        with self._lock:
            self._last_arrival.pop(lane, None)

    def _reserve(self, nbytes: int, ready_at: float | None) -> float:
        now = self._clock()
        offered = now if ready_at is None else min(now, ready_at)
        # GCRA form of a token bucket: tat is when the bucket will have paid for every byte
        # reserved so far; a message may leave once tat - burst is not in the future.
        tat = max(self._tat, offered) + nbytes / self.rate
        self._tat = tat
        return max(offered, tat - self.burst_s)

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
        self, arrival: float, deadline: Deadline | None = None, what: str = "a message"
    ) -> None:
        """Sleep until `arrival`; ChannelTimeout at the deadline (not later) if that is sooner."""
        if deadline is not None and arrival > deadline.at:
            self._sleep(max(0.0, deadline.at - self._clock()))
            raise deadline.timeout(
                f"emulated link {self.link.name!r} cannot deliver {what} in time"
            )
        wait = arrival - self._clock()
        if wait > 0:
            self._sleep(wait)

    def return_delay(self, lane: int = 0) -> float:
        """A one-way delay sample for a tiny message going back on `lane` (an acknowledgement);
        drawn from its own seeded stream so the forward samples do not depend on it."""
        with self._lock:
            return self.link.rtt_ms / 2e3 + self.link.jitter.sample_ms(self._rng(-1 - lane)) / 1e3


def link_from_params(params: dict | LinkModel | None, name: str = "emulated") -> LinkModel | None:
    """A LinkModel from a graph's link entry ({gbps, rtt_ms, jitter: {p50_ms, p99_ms, dist}})."""
    if params is None or isinstance(params, LinkModel):
        return params
    from pddflow.core.link import Jitter

    jit = params.get("jitter") or {}
    return LinkModel(
        name=str(params.get("name", name)),
        a=str(params.get("a", "A")),
        b=str(params.get("b", "B")),
        gbps=float(params["gbps"]),
        rtt_ms=float(params.get("rtt_ms", 0.0)),
        jitter=Jitter(**jit) if isinstance(jit, dict) else jit,
    )
