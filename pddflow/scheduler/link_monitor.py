"""A WAN link's state measured from the transfers that cross it (the runtime's frontend feeds it):
the rate a new flow would get and the transfer time P90, both decaying so that a link that
degrades or recovers is seen within seconds. Until it has measured anything, and again after a long
silence, the graph's link model is the estimate."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

from pddflow.core.link import LinkModel
from pddflow.core.stats import percentile
from pddflow.scheduler.features import LinkEstimate

HALF_LIFE_S = 10.0  # a measurement's weight halves every this many seconds
PRIOR_WEIGHT = 0.05  # the link model's weight beside the measurements (one fresh one outweighs it)
MIN_RATE_BYTES = 256 * 1024  # a smaller transfer measures the link's latency, not its rate
P90_WINDOW_S = 60.0  # transfer times older than this leave the P90
# a transfer neither ended nor failed by then was lost with its sender (channel deadlines are
# tens of seconds): it stops counting as a flow in flight
IN_FLIGHT_MAX_S = 300.0


@dataclass(frozen=True)
class _Measured:
    at: float
    # log of the whole link's time per byte (the flow's, over the flows sharing it). Averaged as
    # logs: a link slowed 40-fold and one recovered are both seen at once (an average of rates
    # let the model hide the slowdown: 0.024 Gbps for 0.01; of times per byte, the recovery)
    log_s_per_byte: float


class LinkMonitor:
    def __init__(self, model: LinkModel, clock: Callable[[], float] = time.monotonic):
        self.model, self.clock = model, clock
        self.rates: deque[_Measured] = deque(maxlen=256)
        self.durations: deque[tuple[float, float]] = deque(maxlen=256)  # (ended at, seconds)
        # transfer -> (flows already crossing at its start, when it started, its bytes)
        self.active: dict[Hashable, tuple[int, float, float]] = {}

    def started(self, transfer: Hashable, nbytes: float = 0.0) -> None:
        self._expire()
        self.active[transfer] = (len(self.active), self.clock(), nbytes)

    def forget(self, lost: Callable[[Hashable], bool]) -> None:
        """Transfers whose sender or receiver is gone will not end: they stop counting."""
        for transfer in [t for t in self.active if lost(t)]:
            del self.active[transfer]

    def _expire(self) -> None:
        now = self.clock()
        for transfer in [t for t, (_, t0, _) in self.active.items() if now - t0 > IN_FLIGHT_MAX_S]:
            del self.active[transfer]

    def ended(self, transfer: Hashable, nbytes: float | None, seconds: float | None) -> None:
        """`nbytes`/`seconds` None: the transfer failed (it only frees its slot)."""
        started = self.active.pop(transfer, None)
        if started is None or nbytes is None or seconds is None:
            return
        others = started[0]
        now = self.clock()
        self.durations.append((now, seconds))
        moving = seconds - self.model.rtt_ms / 1e3
        if nbytes >= MIN_RATE_BYTES and moving > 0:
            sharing = max(others, len(self.active)) + 1
            self.rates.append(_Measured(now, math.log(moving / (nbytes * sharing))))

    def link_bytes_per_s(self) -> float:
        now = self.clock()
        total, weight = -math.log(self.model.bytes_per_s) * PRIOR_WEIGHT, PRIOR_WEIGHT
        for m in self.rates:
            w = 0.5 ** ((now - m.at) / HALF_LIFE_S)
            total, weight = total + w * m.log_s_per_byte, weight + w
        return 1.0 / max(math.exp(total / weight), self._overstaying(now))

    def _overstaying(self, now: float) -> float:
        """The slowest time per byte the transfers still crossing already prove: one that has run
        longer than the estimate allows for its bytes says the link is at least that slow, long
        before it ends (a link slowed 30-fold shows in seconds, not after its first transfer)."""
        rtt, sharing = self.model.rtt_ms / 1e3, len(self.active)
        slowest = 0.0
        for _, t0, nbytes in self.active.values():
            moving = now - t0 - rtt
            if nbytes >= MIN_RATE_BYTES and moving > 0:
                slowest = max(slowest, moving / (nbytes * sharing))
        return slowest

    def transfer_p90_s(self) -> float | None:
        """Of the transfers that ended in the last P90_WINDOW_S; None when there were none."""
        now = self.clock()
        recent = [s for at, s in self.durations if now - at <= P90_WINDOW_S]
        return percentile(sorted(recent), 90) if recent else None

    def estimate(self) -> LinkEstimate:
        """The model's latency quantiles, the measured rate shared with the flows in flight."""
        self._expire()
        flows = len(self.active)
        base = LinkEstimate.from_model(self.model, flows)
        return replace(base, bytes_per_s=self.link_bytes_per_s() / (flows + 1))

    def report(self) -> dict[str, float | int | None]:
        p90 = self.transfer_p90_s()
        return {
            "model_gbps": self.model.gbps,
            "estimated_gbps": round(self.link_bytes_per_s() * 8 / 1e9, 6),
            "active_transfers": len(self.active),
            "transfer_p90_s": None if p90 is None else round(p90, 4),
            "measurements": len(self.rates),
        }
