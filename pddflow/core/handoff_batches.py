"""How the relay's token-ID handoff to main is split into batches. The relay worker and the
simulator both ask `HandoffBatches.step` after every relay token and whenever main has extended
all it was sent, so the two split a handoff the same way (docs/scheduler.md, Handoff)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class HandoffStep(Enum):
    WAIT = "wait"  # keep decoding on the relay, send nothing yet
    BATCH = "batch"  # send the unsent IDs; the relay keeps decoding (catch-up)
    FINAL = "final"  # send the unsent IDs and stop: main decodes from here


@dataclass(frozen=True)
class HandoffBatches:
    catch_up_tokens: int = 32
    # no extend on main smaller than this (a tail chunk is a whole step of main's for a few
    # tokens), unless it is the whole remainder of a relay sequence that finished
    min_extend_tokens: int = 8
    # adaptive handoff, re-decided between catch-up batches: a relay this loaded hands main the
    # rest at once; 0 never switches (a declared one_shot or catch_up)
    catch_up_load: float = 0.0

    def step(
        self, mode: str, unsent: int, *, finished: bool, main_waiting: bool, relay_load: float
    ) -> HandoffStep:
        """`mode` one_shot | catch_up; `main_waiting`: main has extended every ID sent so far
        (true at the start of the handoff)."""
        if finished:
            return HandoffStep.FINAL
        if unsent < self.min_extend_tokens:
            return HandoffStep.WAIT  # the relay produces a few more first
        if mode == "one_shot" or self.busy(relay_load):
            return HandoffStep.FINAL
        if main_waiting:  # main caught up: close the gap when one batch covers it
            return HandoffStep.FINAL if unsent <= self.catch_up_tokens else HandoffStep.BATCH
        return HandoffStep.BATCH if unsent >= self.catch_up_tokens else HandoffStep.WAIT

    def busy(self, relay_load: float) -> bool:
        return 0 < self.catch_up_load <= relay_load

    def switched(self, mode: str, unsent: int, *, main_waiting: bool, relay_load: float) -> bool:
        """A FINAL step of a catch-up handoff that only the relay's load made final."""
        closes = main_waiting and unsent <= self.catch_up_tokens
        return mode == "catch_up" and self.busy(relay_load) and not closes
