"""Percentiles: one definition, so the simulator and `bench serve` agree on every P90."""

from __future__ import annotations

import math


def percentile(sorted_values: list[float], q: float) -> float:
    """Percentile q in [0, 100] of an ascending list, interpolated as numpy does; NaN if empty."""
    if not sorted_values:
        return math.nan
    k = (len(sorted_values) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)
