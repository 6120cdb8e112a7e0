"""One instance's KV memory: the engine's radix cache plus reservations, its events forwarded to
the scheduler's mirror (docs/simulator.md, KV and caches).

A hold is `acquire`d (or `pin`ned, then `reserve`d once the KV lands), `commit`ted when its blocks
land (cached, still locked) and `release`d when done (evictable LRU)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from pddflow.operators.radix_cache import RadixCache
from pddflow.scheduler.mirror import CacheMirror, MirrorDrift


class _Block:
    __slots__ = ("h", "refs")

    def __init__(self, h: int):
        self.h = h
        self.refs = 0


class Hold:
    __slots__ = ("blocks", "reserved", "hit", "missing")

    def __init__(self, blocks: list, reserved: int, hit: int, missing: int):
        self.blocks = blocks  # cache blocks this request keeps locked
        self.reserved = reserved  # blocks reserved outside the cache
        self.hit = hit  # leading blocks the cache held at acquire time
        self.missing = missing  # prompt blocks that must arrive (or be computed)


class KVStore:
    def __init__(
        self,
        name: str,
        capacity_blocks: int,
        cached: bool,
        mirror: CacheMirror | None = None,
        strict: bool = False,
    ):
        self.name = name
        self.capacity = capacity_blocks
        self.cache = (
            RadixCache(None, on_evict=self._on_evict, evictable=_unreferenced) if cached else None
        )
        self.mirror = mirror
        self.strict = strict  # full mirror comparison after every event (tests)
        self.reserved = 0
        self.waiters: deque[Callable[[], bool]] = deque()
        self._evicted: list[int] = []
        self.evicted_blocks = 0
        self.peak_used = 0
        self._locked = 0
        self._waking = False

    @property
    def used(self) -> int:
        return (len(self.cache) if self.cache is not None else 0) + self.reserved

    def locked_or_reserved(self) -> int:
        """Blocks held by live requests (what `kv_used` reports to the scheduler)."""
        return self.reserved + self._locked

    def acquire(self, hashes: tuple[int, ...], extra_blocks: int) -> Hold | None:
        """None when memory is short now (retry after a release); ValueError if it never fits."""
        hold = self.pin(hashes)
        try:
            if self.reserve(hold, extra_blocks):
                return hold
        except ValueError:
            self._unlock(hold)
            raise
        self._unlock(hold)
        return None

    def pin(self, hashes: tuple[int, ...]) -> Hold:
        matched = self.cache.match(hashes) if self.cache is not None else []
        for b in matched:
            b.refs += 1
            if b.refs == 1:
                self._locked += 1
        return Hold(matched, 0, len(matched), len(hashes) - len(matched))

    def reserve(self, hold: Hold, extra_blocks: int) -> bool:
        """False when memory is short now; ValueError if it can never fit."""
        need = hold.missing + extra_blocks
        if need + len(hold.blocks) > self.capacity:
            raise ValueError(
                f"{self.name}: a request needs {need + len(hold.blocks)} KV blocks, "
                f"the budget holds {self.capacity}"
            )
        if not self._make_room(need):
            return False
        self.reserved += need
        hold.reserved += need
        if self.used > self.peak_used:
            self.peak_used = self.used
        return True

    def commit(self, hold: Hold, hashes: tuple[int, ...]) -> int:
        """The prompt's blocks are here: insert them (locked); returns how many were new."""
        self.reserved -= hold.missing
        hold.reserved -= hold.missing
        if self.cache is None:
            self.reserved += hold.missing  # no cache: the prompt stays a plain reservation
            hold.reserved += hold.missing
            hold.missing = 0
            return 0
        tail = hashes[hold.hit :]
        hold.missing = 0
        if not tail:
            return 0
        new = self._insert_locked(hold, hashes, skip=hold.hit)
        if self.used > self.peak_used:
            self.peak_used = self.used
        return new

    def commit_more(self, hold: Hold, hashes: tuple[int, ...]) -> int:
        """Insert blocks generated here (locked), paid from the hold's output reservation."""
        if self.cache is None:
            return 0
        have = len(hold.blocks)
        take = min(max(len(hashes) - have, 0), hold.reserved)
        if take <= 0 or self.cache.match_len(hashes[:have]) < have:
            return 0
        hashes = hashes[: have + take]
        self.reserved -= take
        hold.reserved -= take
        return self._insert_locked(hold, hashes, skip=have)

    def _insert_locked(self, hold: Hold, hashes: tuple[int, ...], skip: int) -> int:
        stored = self.cache.insert(hashes, [_Block(h) for h in hashes])
        new = [h for h, s in zip(hashes, stored) if s]
        for b in self.cache.match(hashes, touch=False)[skip:]:
            b.refs += 1
            if b.refs == 1:
                self._locked += 1
            hold.blocks.append(b)
        if new:
            if self.mirror is not None:
                self.mirror.on_insert(new)
                self._check()
        return len(new)

    def release(self, hold: Hold) -> None:
        self._unlock(hold)
        self.reserved -= hold.reserved
        hold.reserved = 0
        self._wake()

    def wait(self, retry: Callable[[], bool]) -> None:
        """`retry` is called after releases (FIFO) until it returns True."""
        self.waiters.append(retry)

    def _unlock(self, hold: Hold) -> None:
        for b in hold.blocks:
            b.refs -= 1
            if b.refs == 0:
                self._locked -= 1
        hold.blocks = []

    def _make_room(self, need: int) -> bool:
        over = self.used + need - self.capacity
        if over > 0 and self.cache is not None:
            self.cache.evict(over)
            if self._evicted:
                self.evicted_blocks += len(self._evicted)
                if self.mirror is not None:
                    self.mirror.on_evict(self._evicted)
                self._evicted = []
                self._check()
        return self.used + need <= self.capacity

    def _wake(self) -> None:
        if self._waking:  # a retry released memory itself: the outer loop carries on
            return
        self._waking = True
        try:
            while self.waiters:
                retry = self.waiters.popleft()
                if not retry():
                    self.waiters.appendleft(retry)
                    return
        finally:
            self._waking = False

    def _on_evict(self, block: _Block) -> None:
        self._evicted.append(block.h)

    def _check(self) -> None:
        if len(self.mirror) != len(self.cache):
            raise MirrorDrift(
                f"{self.name}: mirror holds {len(self.mirror)} blocks, cache {len(self.cache)}"
            )
        if self.strict:
            self.check_mirror()

    def check_mirror(self) -> None:
        if self.mirror is not None and self.cache is not None:
            self.mirror.check(h for h, _ in self.cache)


def _unreferenced(block: _Block) -> bool:
    return block.refs == 0
