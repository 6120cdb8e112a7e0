"""A time-varying arrival rate laid over a workload (`simulate --arrival-profile`): its sessions'
first requests are re-timed so the rate follows the profile, in order, with the workload's own
gaps between them stretched or squeezed; later turns still follow their parent's end.

- `diurnal[:R]`: one day's cycle over the workload's span, quietest at its start and end and R
  times busier at its middle (default 4), the mean rate the workload's own;
- `T:M,T:M,...`: piecewise, the rate multiplied by M from T seconds on (the first T is 0)."""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, replace

from pddflow.sim.workload import Workload

DEFAULT_PEAK_TO_TROUGH = 4.0


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class ArrivalProfile:
    text: str
    peak_to_trough: float | None = None  # diurnal
    steps: tuple[tuple[float, float], ...] = ()  # piecewise: (from_s, multiplier)

    def multiplier(self, t: float, span_s: float) -> float:
        if self.peak_to_trough is not None:
            a = (self.peak_to_trough - 1) / (self.peak_to_trough + 1)
            return 1 - a * math.cos(2 * math.pi * t / span_s)
        i = bisect_right([s[0] for s in self.steps], t) - 1
        return self.steps[max(i, 0)][1]

    def _cumulative(self, t: float, span_s: float) -> float:
        """Workload seconds that pass by `t` of the profile's time (the multiplier's integral)."""
        if self.peak_to_trough is not None:
            a = (self.peak_to_trough - 1) / (self.peak_to_trough + 1)
            w = 2 * math.pi / span_s
            return t - a * math.sin(w * t) / w
        total, steps = 0.0, self.steps
        for (t0, m), nxt in zip(steps, [*steps[1:], (math.inf, 0.0)], strict=False):
            if t <= t0:
                break
            total += m * (min(t, nxt[0]) - t0)
        return total

    def time_of(self, base_s: float, span_s: float) -> float:
        """The profile's time at which `base_s` of the workload's own time has passed."""
        if base_s <= 0:
            return 0.0
        lo, hi = 0.0, max(base_s, 1.0)
        while self._cumulative(hi, span_s) < base_s:
            hi *= 2
        for _ in range(60):
            mid = (lo + hi) / 2
            if self._cumulative(mid, span_s) < base_s:
                lo = mid
            else:
                hi = mid
        return hi

    def apply(self, workload: Workload) -> Workload:
        span = workload.duration_s
        if span <= 0:
            raise ProfileError(f"--arrival-profile: workload {workload.name!r} has no duration")
        t0 = workload.requests[0].arrival_s
        reqs = [
            r if r.parent >= 0 else replace(r, arrival_s=t0 + self.time_of(r.arrival_s - t0, span))
            for r in workload.requests
        ]
        return replace(
            workload, requests=reqs, meta={**workload.meta, "arrival_profile": self.text}
        )


def parse_profile(text: str) -> ArrivalProfile:
    """`diurnal`, `diurnal:R` or `T:M,T:M,...` (see the module); ProfileError names the fix."""
    t = text.strip()
    if t == "diurnal" or t.startswith("diurnal:"):
        r = t.partition(":")[2] or str(DEFAULT_PEAK_TO_TROUGH)
        try:
            ratio = float(r)
        except ValueError:
            ratio = -1.0
        if not ratio >= 1:
            raise ProfileError(
                f"--arrival-profile {text!r}: diurnal:R takes R >= 1, the peak rate over the "
                f"quietest (e.g. diurnal:4)"
            )
        return ArrivalProfile(t, peak_to_trough=ratio)
    steps = []
    for part in t.split(","):
        start, sep, mult = part.partition(":")
        try:
            step = (float(start), float(mult))
        except ValueError:
            step = None
        if not sep or step is None or step[0] < 0 or step[1] <= 0:
            raise ProfileError(
                f"--arrival-profile {text!r}: {part!r} is not SECONDS:MULTIPLIER (e.g. "
                f"0:1,600:4,1200:1), or use diurnal[:R]"
            )
        steps.append(step)
    if steps[0][0] != 0 or any(b[0] <= a[0] for a, b in zip(steps, steps[1:], strict=False)):
        raise ProfileError(
            f"--arrival-profile {text!r}: the steps start at 0 and their times increase"
        )
    return ArrivalProfile(t, steps=tuple(steps))
