"""The router's mirror of one radix cache: a set of hashes fed by the cache's own events."""

from __future__ import annotations

from collections.abc import Iterable


class MirrorDrift(AssertionError):
    """The mirror and the cache it mirrors disagree: an event was lost or applied twice."""


class CacheMirror:
    __slots__ = ("instance", "_blocks", "_digest")

    def __init__(self, instance: str):
        self.instance = instance
        self._blocks: set[int] = set()
        self._digest = 0

    def on_insert(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            if h in self._blocks:
                raise MirrorDrift(
                    f"{self.instance}: insert of block {h:#x} the mirror already holds"
                )
            self._blocks.add(h)
            self._digest ^= h

    def on_evict(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            try:
                self._blocks.remove(h)
            except KeyError:
                raise MirrorDrift(
                    f"{self.instance}: eviction of block {h:#x} the mirror does not hold"
                ) from None
            self._digest ^= h

    def reset(self, hashes: Iterable[int]) -> None:
        """Replace the mirror with the cache's full listing (after a lost report)."""
        self._blocks = set(hashes)
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
