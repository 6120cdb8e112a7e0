"""One replica's capacity within the SLA, the planner's unit of supply: from the device model
`size` and the simulator use (`DeviceModel`), or from what the runtime's workers measured
(`StepFit`: decode step seconds against the batch, fit over the status reports)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol


class StepTimes(Protocol):
    """What the planner reads of the simulator's step-time model (`pddflow.core.device_model`)."""

    def decode_step_s(self, batch: int, ctx_sum: float) -> float: ...


def batch_within(step_s: Callable[[int], float], tpot_s: float, max_batch: int) -> int:
    """The largest batch (1..max_batch) one step of which takes at most `tpot_s`; at least 1:
    a replica too slow for the SLA still serves one sequence."""
    lo, hi = 1, max(1, max_batch)
    if step_s(hi) <= tpot_s:
        return hi
    while lo < hi:  # step time grows with the batch
        mid = (lo + hi + 1) // 2
        if step_s(mid) <= tpot_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def modeled_decode(model: StepTimes, context: float, tpot_s: float, max_batch: int) -> int:
    """Sequences of `context` tokens one replica steps within `tpot_s`."""
    return batch_within(lambda b: model.decode_step_s(b, b * context), tpot_s, max_batch)


class StepFit:
    """Decode step seconds = a + b x batch, least squares over the last reports' means (each a
    worker's steps between two status reports); with one batch size seen, the step time is
    taken as flat at it (what one sees is all one knows)."""

    def __init__(self, keep: int = 64):
        self.points: deque[tuple[float, float, float]] = deque(maxlen=keep)  # batch, step_s, w

    def add(self, steps: float, seqs: float, wall_s: float) -> None:
        if steps > 0 and wall_s > 0:
            self.points.append((seqs / steps, wall_s / steps, steps))

    def step_s(self, batch: int) -> float | None:
        if not self.points:
            return None
        w = sum(p[2] for p in self.points)
        mx = sum(p[0] * p[2] for p in self.points) / w
        my = sum(p[1] * p[2] for p in self.points) / w
        var = sum(p[2] * (p[0] - mx) ** 2 for p in self.points)
        slope = (
            max(0.0, sum(p[2] * (p[0] - mx) * (p[1] - my) for p in self.points) / var)
            if var > 1e-9
            else 0.0
        )
        return max(1e-6, my + slope * (batch - mx))

    def batch_within(self, tpot_s: float, max_batch: int) -> int | None:
        if not self.points:
            return None
        return batch_within(lambda b: self.step_s(b) or 0.0, tpot_s, max_batch)
