"""How fast a prefill instance prefills, measured from the prefills it finished (the runtime's
frontend and the simulator feed it the same way): seconds per uncached prompt token, decaying so a
slower or faster instance is seen within seconds. The SLA rule predicts queue + prefill with it."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

HALF_LIFE_S = 10.0  # a measurement's weight halves every this many seconds
# a prefill of fewer new tokens measures its fixed per-call cost, not the per-token rate
MIN_TOKENS = 64


class PrefillRate:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.seen: deque[tuple[float, int, float]] = deque(maxlen=256)  # (at, tokens, seconds)

    def finished(self, tokens: int, seconds: float) -> None:
        """One prefill of `tokens` uncached prompt tokens took `seconds` of compute."""
        if tokens >= MIN_TOKENS and seconds > 0:
            self.seen.append((self.clock(), tokens, seconds))

    def s_per_token(self) -> float:
        """0.0 until a prefill was measured: the rule then predicts from the transfer alone."""
        now = self.clock()
        tokens = seconds = 0.0
        for at, n, s in self.seen:
            w = 0.5 ** ((now - at) / HALF_LIFE_S)
            tokens, seconds = tokens + w * n, seconds + w * s
        return seconds / tokens if tokens > 0 else 0.0
