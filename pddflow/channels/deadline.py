"""Deadlines: every blocking call in `pddflow.channels` takes one and fails with `ChannelTimeout`
when it passes, so a peer that never answers cannot hang a worker."""

from __future__ import annotations

import math
import time

from pddflow.channels.errors import ChannelTimeout


class Deadline:
    """An absolute `time.monotonic()` instant. `Deadline.of(timeout_s, deadline)` picks the earlier
    of a relative timeout and an absolute deadline (e.g. `Request.deadline_s`); both None is
    refused: there is no infinite wait in this package."""

    __slots__ = ("at", "what")

    def __init__(self, at: float, what: str = "channel call"):
        self.at = at
        self.what = what

    @classmethod
    def of(
        cls, timeout_s: float | None, deadline: float | None = None, what: str = "channel call"
    ) -> Deadline:
        candidates = []
        if timeout_s is not None:
            candidates.append(time.monotonic() + float(timeout_s))
        if deadline is not None:
            candidates.append(float(deadline))
        if not candidates:
            raise ValueError(
                f"{what}: a timeout_s or an absolute deadline is required (no wait is unbounded)"
            )
        return cls(min(candidates), what)

    @classmethod
    def for_call(
        cls,
        timeout_s: float | None,
        deadline: float | None,
        default_s: float,
        what: str = "channel call",
    ) -> Deadline:
        """A channel call's deadline: the earlier of its timeout_s and deadline, or the channel's
        default_s when the caller gave neither."""
        if timeout_s is None and deadline is None:
            timeout_s = default_s
        return cls.of(timeout_s, deadline, what)

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def check(self, doing: str = "") -> float:
        """Seconds left; raises ChannelTimeout when none are."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise self.timeout(doing)
        return left

    def timeout(self, doing: str = "") -> ChannelTimeout:
        return ChannelTimeout(f"{self.what}: deadline passed{' while ' + doing if doing else ''}")

    def __repr__(self) -> str:
        left = self.at - time.monotonic()
        return (
            f"Deadline({self.what!r}, {left:.3f}s left)" if math.isfinite(left) else "Deadline(inf)"
        )
