"""The router's mirror of one radix cache: a set of hashes fed by the cache's own events. With tiers
under the cache (host memory, disk) it holds their union, each block tagged with the fastest tier
holding it: a hit on a lower tier is a hit that must be loaded first."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class MirrorDrift(AssertionError):
    """The mirror and the cache it mirrors disagree: an event was lost or applied twice."""


class CacheMirror:
    __slots__ = ("instance", "_blocks", "_digest", "_lower")

    def __init__(self, instance: str):
        self.instance = instance
        self._blocks: set[int] = set()
        self._digest = 0
        self._lower: dict[int, int] = {}  # hash -> its tier, for blocks held below the device

    def on_insert(self, hashes: Iterable[int], tiers: Sequence[int] = ()) -> None:
        """`tiers`: each block's fastest tier (empty: all on the device)."""
        for i, h in enumerate(hashes):
            if h in self._blocks:
                raise MirrorDrift(
                    f"{self.instance}: insert of block {h:#x} the mirror already holds"
                )
            self._blocks.add(h)
            self._digest ^= h
            if tiers and tiers[i]:
                self._lower[h] = tiers[i]

    def on_move(self, hashes: Iterable[int], tiers: Sequence[int]) -> None:
        """Blocks still cached whose fastest tier changed."""
        for h, tier in zip(hashes, tiers, strict=True):
            if h not in self._blocks:
                raise MirrorDrift(f"{self.instance}: move of block {h:#x} the mirror does not hold")
            if tier:
                self._lower[h] = tier
            else:
                self._lower.pop(h, None)

    def on_evict(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            try:
                self._blocks.remove(h)
            except KeyError:
                raise MirrorDrift(
                    f"{self.instance}: eviction of block {h:#x} the mirror does not hold"
                ) from None
            self._digest ^= h
            self._lower.pop(h, None)

    def reset(self, hashes: Iterable[int], tiers: Sequence[int] = ()) -> None:
        """Replace the mirror with the cache's full listing (after a lost report)."""
        hashes = list(hashes)
        self._blocks = set(hashes)
        self._lower = {h: t for h, t in zip(hashes, tiers) if t}
        self._digest = 0
        for h in self._blocks:
            self._digest ^= h

    def match(self, hashes: Iterable[int]) -> int:
        """Leading blocks held: what a radix match would return."""
        n = 0
        blocks = self._blocks
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def lower(self, hashes: Sequence[int], n: int) -> dict[int, int]:
        """Of the first `n` of `hashes` (a match), the blocks each lower tier holds: tier -> n."""
        out: dict[int, int] = {}
        if self._lower:
            for h in hashes[:n]:
                tier = self._lower.get(h)
                if tier:
                    out[tier] = out.get(tier, 0) + 1
        return out

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def digest(self) -> int:
        """XOR of every held hash: with `len`, an O(1) drift check against a worker's report."""
        return self._digest

    def check(self, cache_blocks: Iterable[int]) -> None:
        actual = set(cache_blocks)
        if actual != self._blocks:
            extra, missing = self._blocks - actual, actual - self._blocks
            raise MirrorDrift(
                f"{self.instance}: mirror has {len(extra)} block(s) the cache lacks and lacks "
                f"{len(missing)} the cache holds (e.g. {sorted(extra or missing)[:3]})"
            )
