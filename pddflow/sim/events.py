"""The discrete-event core: a heap of (time, order, fn, args); `order` keeps same-time events FIFO,
so a run is a pure function of its inputs."""

from __future__ import annotations

import heapq
from collections.abc import Callable


class EventLoop:
    __slots__ = ("now", "_q", "_n", "processed")

    def __init__(self) -> None:
        self.now = 0.0
        self._q: list = []
        self._n = 0
        self.processed = 0

    def at(self, t: float, fn: Callable, *args) -> None:
        self._n += 1
        heapq.heappush(self._q, (t if t > self.now else self.now, self._n, fn, args))

    def after(self, dt: float, fn: Callable, *args) -> None:
        self.at(self.now + dt, fn, *args)

    def run(self, tick: Callable[[float], None] | None = None, tick_every: int = 4096) -> None:
        """Every event, in time order, until none is left; `tick(now)` every `tick_every`."""
        q, pop = self._q, heapq.heappop
        n = 0
        while q:
            t, _, fn, args = pop(q)
            self.now = t
            fn(*args)
            n += 1
            if tick is not None and n % tick_every == 0:
                tick(t)
        self.processed += n
