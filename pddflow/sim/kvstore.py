"""One instance's KV memory: the engine's radix cache plus reservations, its events forwarded to
the scheduler's mirror (docs/simulator.md, KV and caches).

A hold is `acquire`d (or `pin`ned, then `reserve`d once the KV lands), `commit`ted when its blocks
land (cached, still locked) and `release`d when done (evictable LRU).

With a host tier (`host_tier.py`) evicted blocks move there instead of vanishing, and `pin` loads
the run of the prompt's blocks the tier holds after the HBM match back into HBM: they count as hit,
and the hold's `ready_at` is when their load completes. The mirror then holds both tiers (what a
router may predict as a hit): moving a block between them is no mirror event.

A disk tier (graph: `disk_cache`; the same HostTier bookkeeping, its own link) is write-through,
as the runtime's: every block HBM caches is on it too until its LRU drops it, and a hit on it is
loaded (copied, not moved) as a host-tier one. The mirror holds the union of the three."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable

from pddflow.operators.radix_cache import RadixCache
from pddflow.scheduler.mirror import CacheMirror, MirrorDrift
from pddflow.sim.host_tier import HostTier


class _Block:
    __slots__ = ("h", "refs")

    def __init__(self, h: int):
        self.h = h
        self.refs = 0


class Hold:
    __slots__ = ("blocks", "reserved", "hit", "missing", "loaded", "ready_at", "deferred")

    def __init__(
        self,
        blocks: list,
        reserved: int,
        hit: int,
        missing: int,
        loaded: int = 0,
        ready_at: float = 0.0,
    ):
        self.blocks = blocks  # cache blocks this request keeps locked
        self.reserved = reserved  # blocks reserved outside the cache
        self.hit = hit  # leading blocks the cache held at acquire time (either tier)
        self.missing = missing  # prompt blocks that must arrive (or be computed)
        self.loaded = loaded  # of the hit, blocks this pin loaded from the host tier
        self.ready_at = ready_at  # when the hit blocks are all in HBM (host-tier loads)
        # host-tier blocks counted as hit but loaded only when the KV lands (a decoder's pin):
        # pinned in the tier meanwhile, and part of `missing` (they need HBM room then)
        self.deferred: list[int] = []


class KVStore:
    def __init__(
        self,
        name: str,
        capacity_blocks: int,
        cached: bool,
        mirror: CacheMirror | None = None,
        strict: bool = False,
        host: HostTier | None = None,
        disk: HostTier | None = None,
    ):
        self.name = name
        self.capacity = capacity_blocks
        self.cache = (
            RadixCache(None, on_evict=self._on_evict, evictable=_unreferenced) if cached else None
        )
        self.host = host if cached else None
        self.disk = disk if cached else None
        self._hbm: set[int] = set()  # with a disk tier: HBM's hashes (is a block anywhere else?)
        self.mirror = mirror
        self.strict = strict  # full mirror comparison after every event (tests)
        self.reserved = 0
        self.waiters: deque[Callable[[], bool]] = deque()
        self._evicted: list[int] = []
        self.evicted_blocks = 0
        self.peak_used = 0
        self._locked = 0
        self._waking = False
        self._moving: list[int] = []  # blocks on their way from the host tier into HBM

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

    def pin(self, hashes: tuple[int, ...], defer: bool = False) -> Hold:
        """Lock the cached prefix. With a host tier, its run after the HBM match is a hit too:
        loaded now (`defer` False: the caller reserves memory at once), or, for a decoder whose KV
        is still on its way (`defer`), pinned in the tier and loaded when it lands
        (`load_deferred`), so that no HBM is held while the copy travels."""
        matched = self.cache.match(hashes) if self.cache is not None else []
        for b in matched:
            b.refs += 1
            if b.refs == 1:
                self._locked += 1
        hold = Hold(matched, 0, len(matched), len(hashes) - len(matched))
        tiers = self._tiers()
        if tiers:
            hold.ready_at = max(t.ready_at(b.h for b in matched) for t in tiers)
            n = self._run_of(hashes, len(matched))
            if n and defer:
                hold.deferred = list(hashes[len(matched) : len(matched) + n])
                for t in tiers:
                    t.pin(h for h in hold.deferred if h in t)
                hold.hit += n
            elif n:
                self._load(hold, hashes)
        return hold

    def _tiers(self) -> list[HostTier]:
        return [t for t in (self.host, self.disk) if t is not None]

    def _run_of(self, hashes: tuple[int, ...], start: int) -> int:
        """How many of `hashes[start:]`, in order, a tier below HBM holds."""
        if self.disk is None:
            return self.host.run_of(hashes, start) if self.host is not None else 0
        n, host, disk = 0, self.host, self.disk
        while start + n < len(hashes) and (
            hashes[start + n] in disk or (host is not None and hashes[start + n] in host)
        ):
            n += 1
        return n

    def _unpin(self, hashes: list[int]) -> None:
        for t in self._tiers():
            t.unpin(h for h in hashes if h in t._pins)

    def _queue_loads(self, hashes: list[int], in_host: set[int]) -> float:
        """Load `hashes` into HBM, those in `in_host` over the host link and the rest from disk;
        returns when both are done."""
        if self.disk is None:
            return self.host.load(hashes)
        ready = 0.0
        if in_host:
            ready = self.host.load([h for h in hashes if h in in_host])
        rest = [h for h in hashes if h not in in_host]
        if rest:
            ready = max(ready, self.disk.load(rest))
        return ready

    def load_deferred(self, hold: Hold) -> float:
        """The landed request's reservation holds room for its deferred blocks: queue their load;
        returns when they (and any hit block still loading) are in HBM."""
        if hold.deferred:
            hold.loaded = len(hold.deferred)
            in_host = {h for h in hold.deferred if self.host is not None and h in self.host}
            hold.ready_at = max(hold.ready_at, self._queue_loads(hold.deferred, in_host))
        return hold.ready_at

    def _load(self, hold: Hold, hashes: tuple[int, ...]) -> None:
        """Move the host tier's run of `hashes` after the HBM match into HBM (locked, as much as
        fits: a swap, the room made sends other blocks down) and queue its load on the link."""
        host, k = self.host, hold.hit
        run = list(hashes[k : k + self._run_of(hashes, k)])
        in_host = {h for h in run if host is not None and h in host}
        if in_host:  # first, so the evictions below cannot push them out of the tier
            host.take([h for h in run if h in in_host])
        self._moving = run  # held by neither tier meanwhile: the mirror checks count them
        self._make_room(len(run))
        fit = min(len(run), max(self.capacity - self.used, 0))
        back, run = run[fit:], run[:fit]
        self._moving = run
        back = [h for h in back if h in in_host]  # disk blocks never left the disk
        if back:  # no room for them in HBM: back to the tier
            dropped = [h for h in host.put(back) if self.disk is None or h not in self.disk]
            if dropped and self.mirror is not None:
                self.mirror.on_evict(dropped)
        if run:
            self._insert_locked(hold, hashes[: k + fit], skip=k, moved=True)
        self._moving = []
        if self.mirror is not None:
            self._check()
        if not run:
            return
        hold.hit += fit
        hold.missing -= fit
        hold.loaded = fit
        hold.ready_at = max(hold.ready_at, self._queue_loads(run, in_host))
        if self.used > self.peak_used:
            self.peak_used = self.used

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
        have = len(hold.blocks)  # the hit less any deferred blocks, which are inserted now
        if hold.deferred:
            self._unpin(hold.deferred)
            hold.deferred = []
        hold.missing = 0
        if not hashes[have:]:
            return 0
        new = self._insert_locked(hold, hashes, skip=have)
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

    def _insert_locked(
        self, hold: Hold, hashes: tuple[int, ...], skip: int, moved: bool = False
    ) -> int:
        """`moved`: the new blocks come from the host tier (the mirror holds them already; the
        caller checks the mirror once the move is complete)."""
        stored = self.cache.insert(hashes, [_Block(h) for h in hashes])
        new = [h for h, s in zip(hashes, stored) if s]
        for b in self.cache.match(hashes, touch=False)[skip:]:
            b.refs += 1
            if b.refs == 1:
                self._locked += 1
            hold.blocks.append(b)
        back: set[int] = set()
        if new and not moved and self.host is not None:
            # computed or arrived again while the host tier still held them: one copy, in HBM
            back = {h for h in new if h in self.host}
            self.host.take(back)
        if self.disk is not None and new:
            self._hbm.update(new)
            back |= {h for h in new if h in self.disk}  # the mirror holds them already
            gone = [h for h in self.disk.put(new) if h not in self._hbm]  # written through
            gone = [h for h in gone if self.host is None or h not in self.host]
            if gone and self.mirror is not None:
                self.mirror.on_evict(gone)
        if new and self.mirror is not None and not moved:
            if len(back) < len(new):
                self.mirror.on_insert([h for h in new if h not in back])
            self._check()
        return len(new)

    def release(self, hold: Hold) -> None:
        if hold.deferred:  # never landed
            self._unpin(hold.deferred)
            hold.deferred = []
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
                # to the host tier, if any: the mirror forgets only what leaves every tier
                gone = self._evicted if self.host is None else self.host.put(self._evicted)
                if self.disk is not None:  # on disk too: still cached, still mirrored
                    gone = [h for h in gone if h not in self.disk]
                self._evicted = []
                if self.mirror is not None:
                    if gone:
                        self.mirror.on_evict(gone)
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

    def _on_evict(self, _h: int, block: _Block) -> None:
        self._evicted.append(block.h)
        self._hbm.discard(block.h)

    def _check(self) -> None:
        if self.disk is not None:  # the tiers overlap: only a full comparison tells
            if self.strict:
                self.check_mirror()
            return
        held = len(self.cache) + len(self._moving)
        held += len(self.host) if self.host is not None else 0
        if len(self.mirror) != held:
            raise MirrorDrift(
                f"{self.name}: mirror holds {len(self.mirror)} blocks, cache {len(self.cache)}"
                + (f" + host tier {len(self.host)}" if self.host is not None else "")
            )
        if self.strict:
            self.check_mirror()

    def check_mirror(self) -> None:
        if self.mirror is not None and self.cache is not None:
            cached = (h for h, _ in self.cache)
            if self.host is not None:
                cached = itertools.chain(cached, self.host.blocks, self._moving)
            if self.disk is not None:
                cached = itertools.chain(cached, self.disk.blocks, self._moving)
            self.mirror.check(cached)


def _unreferenced(block: _Block) -> bool:
    return block.refs == 0
