"""Live link estimates from observed transfers, for callers that measure rather than model.

The runtime feeds every finished WAN transfer (bytes, seconds, flows in flight when it started);
the estimator keeps an EWMA of per-flow throughput and a window of per-transfer extra delays, and
answers a `LinkEstimate`. It starts from the link's declared model, so the first decisions are sane.
"""

from __future__ import annotations

from collections import deque

from pddflow.core.link import LinkModel
from pddflow.scheduler.features import LinkEstimate


class LinkEstimator:
    def __init__(self, link: LinkModel, window: int = 256, alpha: float = 0.2):
        self.link = link
        self.alpha = alpha
        self.link_bytes_per_s = link.bytes_per_s  # whole-link throughput estimate
        self.delays: deque[float] = deque(maxlen=window)
        self.active = 0

    def started(self) -> None:
        self.active += 1

    def finished(self, nbytes: float, seconds: float, flows: int = 1) -> None:
        """One transfer of `nbytes` took `seconds` while `flows` transfers shared the link."""
        self.active = max(0, self.active - 1)
        ideal = self.link.rtt_ms / 1e3 + nbytes * max(flows, 1) / self.link_bytes_per_s
        self.delays.append(max(0.0, seconds - ideal))
        if nbytes > 0 and seconds > 0:
            rate = nbytes * max(flows, 1) / seconds
            self.link_bytes_per_s += self.alpha * (
                min(rate, self.link.bytes_per_s) - self.link_bytes_per_s
            )

    def estimate(self) -> LinkEstimate:
        prior = LinkEstimate.from_model(self.link, self.active)
        if len(self.delays) < 20:
            return prior
        d = sorted(self.delays)

        def q(x: float) -> float:
            return d[min(len(d) - 1, int(x * len(d)))]

        return LinkEstimate(
            self.link.name,
            self.link_bytes_per_s / (self.active + 1),
            self.link.rtt_ms / 1e3,
            q(0.5),
            q(0.9),
            q(0.99),
            self.active,
        )
