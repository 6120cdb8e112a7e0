"""The network: uncontended RDMA inside a cluster, processor-shared WAN links with jitter and
per-flow caps between clusters (docs/simulator.md, Network). A flow's cap is the graph's declared
transfer limit (`Plan.flow_cap_gbps`: wan_flight streams x the link's stream_gbps)."""

from __future__ import annotations

import random
from collections.abc import Callable
from heapq import heappop, heappush

from pddflow.core.link import LinkModel
from pddflow.sim.events import EventLoop

RDMA_LATENCY_S = 20e-6
# caps the lognormal jitter tail: PDD measured cross-DC KV transfers between 1 and 20 s
MAX_DELAY_S = 20.0
IDS_BYTES_PER_TOKEN = 15  # token-ID handoff on the wire (PDD: 1.5 KB per 100 tokens)


class Flow:
    __slots__ = ("fid", "nbytes", "start_v", "on_done", "state", "sent")

    def __init__(self, fid: int, nbytes: float, on_done: Callable):
        self.fid, self.nbytes, self.on_done = fid, nbytes, on_done
        self.start_v = 0.0
        self.state = "latency"  # latency -> data -> done | cancelled
        self.sent = 0.0


class SharedLink:
    def __init__(
        self, loop: EventLoop, model: LinkModel, rng: random.Random, flow_cap_gbps: float = 0.0
    ):
        self.loop, self.model, self.rng = loop, model, rng
        self.bw = model.bytes_per_s
        self.cap = flow_cap_gbps * 1e9 / 8 if flow_cap_gbps > 0 else self.bw
        self.v = 0.0  # bytes each active flow has received since t=0 (virtual service)
        self.t = 0.0
        self.active: dict[int, Flow] = {}
        self.heap: list[tuple[float, int]] = []
        self._ver = 0
        self._fid = 0
        self.in_flight = 0  # flows started and not done (latency phase included)
        self.bytes_sent = 0.0

    def send(self, nbytes: float, on_done: Callable[[float], None]) -> Flow:
        self._fid += 1
        f = Flow(self._fid, nbytes, on_done)
        self.in_flight += 1
        delay = self.model.rtt_ms / 1e3 + min(
            self.model.jitter.sample_ms(self.rng) / 1e3, MAX_DELAY_S
        )
        self.loop.after(delay, self._start_data, f)
        return f

    def cancel(self, f: Flow) -> float:
        """Returns the bytes it had sent."""
        if f.state in ("done", "cancelled"):
            return f.sent
        if f.state == "data":
            self._advance()
            f.sent = min(f.nbytes, self.v - f.start_v)
            del self.active[f.fid]
            self.bytes_sent += f.sent
            self._reschedule()
        f.state = "cancelled"
        self.in_flight -= 1
        return f.sent

    def message(self, nbytes: float, on_done: Callable[[float], None]) -> None:
        """Half an RTT plus bytes at full rate: its own stream, no jitter (PDD: std 4.8 ms)."""
        self.bytes_sent += nbytes
        self.loop.after(self.model.rtt_ms / 2e3 + nbytes / self.bw, self._deliver, on_done)

    def _deliver(self, on_done: Callable[[float], None]) -> None:
        on_done(self.loop.now)

    def rate(self, flows: int) -> float:
        share = self.bw / max(flows, 1)
        return share if share < self.cap else self.cap

    def new_flow_rate(self) -> float:
        """What a transfer started now would get (the router's bandwidth estimate)."""
        return self.rate(self.in_flight + 1)

    def _advance(self) -> None:
        now = self.loop.now
        n = len(self.active)
        if n:
            self.v += (now - self.t) * self.rate(n)
        self.t = now

    def _start_data(self, f: Flow) -> None:
        if f.state != "latency":
            return
        if f.nbytes <= 0:
            self._finish(f)
            return
        self._advance()
        f.state = "data"
        f.start_v = self.v
        self.active[f.fid] = f
        heappush(self.heap, (f.start_v + f.nbytes, f.fid))
        self._reschedule()

    def _reschedule(self) -> None:
        heap, active = self.heap, self.active
        while heap and heap[0][1] not in active:
            heappop(heap)
        self._ver += 1
        if heap:
            dt = max(0.0, (heap[0][0] - self.v) / self.rate(len(active)))
            self.loop.after(dt, self._complete, self._ver)

    def _complete(self, ver: int) -> None:
        if ver != self._ver:
            return
        self._advance()
        heap, active = self.heap, self.active
        eps = 1e-6 * max(1.0, self.v)
        done = []
        while heap and (heap[0][1] not in active or heap[0][0] <= self.v + eps):
            _, fid = heappop(heap)
            f = active.pop(fid, None)
            if f is not None:
                done.append(f)
        for f in done:
            f.sent = f.nbytes
            f.state = "done"
            self.in_flight -= 1
            self.bytes_sent += f.nbytes
        self._reschedule()
        for f in done:
            f.on_done(self.loop.now)

    def _finish(self, f: Flow) -> None:
        f.state = "done"
        self.in_flight -= 1
        f.on_done(self.loop.now)
