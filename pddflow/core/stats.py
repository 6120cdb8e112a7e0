"""Percentiles, one definition for every report (the simulator and `bench serve` are compared
figure by figure, so they must not pick different samples for the same P90)."""

from __future__ import annotations

import math


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of an ascending list, as numpy's default;
    NaN when empty."""
    if not sorted_values:
        return math.nan
    k = (len(sorted_values) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)
