"""An engine's cache as a worker reads it, with or without tiers under the device (no torch: a
modeled engine's worker reads it too): the mirror's listing, the changes since the last report,
the blocks held, and what one adoption loaded from below the device."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pddflow.core.cache_tiers import DEVICE


@dataclass(frozen=True)
class TierLoad:
    """What one adoption loaded from below the device: blocks per tier, and the seconds it took
    (reading the tiers and copying into device blocks)."""

    blocks: dict[str, int]
    seconds: float

    @property
    def total(self) -> int:
        return sum(self.blocks.values())


NO_LOAD = TierLoad({}, 0.0)


def cache_listing(radix, tiers: Any) -> list[tuple[int, int]]:
    """(hash, fastest tier) of every block an engine caches, tier 0 the device: the mirror's
    full listing."""
    if tiers is not None:
        return tiers.listing()
    return sorted((h, DEVICE) for h, _ in radix)


def cached_hashes(radix, tiers: Any) -> Iterable[int]:
    """Every block an engine caches, in no order (a status report's count and digest: no sort)."""
    return tiers.held() if tiers is not None else (h for h, _ in radix)


def cache_changes(
    radix, tiers: Any
) -> tuple[list[tuple[int, int]], list[int], list[tuple[int, int]]]:
    """Net (inserted, evicted, moved) since the last call (KVTiers.take_changes), with or without
    tiers under the radix cache."""
    if tiers is not None:
        return tiers.take_changes()
    inserted, evicted = radix.take_changes()
    return [(h, DEVICE) for h in inserted], evicted, []
