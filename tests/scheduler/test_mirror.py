"""The mirror stays exact: fed the cache's own insert/evict events, it answers every match as the
radix cache does, under random traffic with evictions; a lost event is detected."""

from __future__ import annotations

import random

import pytest

from pddflow.operators.radix_cache import RadixCache
from pddflow.scheduler import CacheMirror, MirrorDrift
from pddflow.sim.kvstore import KVStore


def _prompts(rng: random.Random, n: int) -> list[tuple[int, ...]]:
    """Sessions extending their previous prompt, plus fresh ones: chained like real hashes."""
    out, sessions, nid = [], [], [1000]
    for _ in range(n):
        if sessions and rng.random() < 0.7:
            i = rng.randrange(len(sessions))
            if len(sessions[i]) > 30:  # compacted: start over from the shared first block
                sessions[i] = (0,)
            grow = rng.randint(1, 4)
            sessions[i] = sessions[i] + tuple(range(nid[0], nid[0] + grow))
            nid[0] += grow
        else:
            k = rng.randint(1, 12)
            sessions.append((0,) + tuple(range(nid[0], nid[0] + k)))
            nid[0] += k
            i = len(sessions) - 1
        out.append(sessions[i])
    return out


@pytest.mark.parametrize("seed", range(5))
def test_mirror_matches_cache_under_eviction(seed):
    rng = random.Random(seed)
    mirror = CacheMirror("main/0")
    store = KVStore("main/0", capacity_blocks=60, cached=True, mirror=mirror, strict=True)
    live = []
    for prompt in _prompts(rng, 400):
        assert mirror.match(prompt) == store.cache.match_len(prompt)
        hold = store.acquire(prompt, extra_blocks=rng.randint(0, 3))
        if hold is None:  # memory short: release the oldest live request first
            store.release(live.pop(0)[0])
            hold = store.acquire(prompt, extra_blocks=0)
            if hold is None:
                continue
        store.commit(hold, prompt)
        live.append((hold, prompt))
        if len(live) > 3 or rng.random() < 0.5:
            store.release(live.pop(0)[0])
    for hold, _ in live:
        store.release(hold)
    assert store.evicted_blocks > 0  # the test exercised eviction
    store.check_mirror()
    assert store.reserved == 0 and store.locked_or_reserved() == 0


def test_mirror_detects_a_lost_event():
    cache = RadixCache()
    mirror = CacheMirror("m")
    cache.insert([1, 2, 3], [None] * 3)
    mirror.on_insert([1, 2])  # one insert event lost
    with pytest.raises(MirrorDrift):
        mirror.check(h for h, _ in cache)
    with pytest.raises(MirrorDrift):
        mirror.on_evict([9])
    with pytest.raises(MirrorDrift):
        mirror.on_insert([1])


def test_mirror_match_stops_at_first_missing_block():
    m = CacheMirror("m")
    m.on_insert([1, 2, 4])
    assert m.match([1, 2, 3, 4]) == 2 and m.match([5, 1]) == 0 and len(m) == 3
    assert m.digest == 1 ^ 2 ^ 4 and m.match([1, 2, 4]) == 3
    m.on_evict([4])
    assert m.digest == 1 ^ 2


@pytest.mark.parametrize("seed", range(3))
def test_change_journal_keeps_mirror_exact(seed):
    """What a worker publishes: the cache's net changes, taken at random points (sometimes after
    several inserts and evictions of the same blocks) and applied evict-then-insert."""
    rng = random.Random(seed)
    cache = RadixCache(capacity=40)
    mirror = CacheMirror("main/0")
    ins, ev = cache.take_changes()  # starts the journal: the (empty) cache as inserted
    mirror.on_insert(ins)
    assert ev == []
    churned = deltas = 0
    for prompt in _prompts(rng, 300):
        cache.insert(prompt, [None] * len(prompt))
        if rng.random() < 0.3:
            cache.evict(rng.randint(1, 5))
            churned += 1
        if rng.random() < 0.4:
            deltas += 1
            ins, ev = cache.take_changes()
            mirror.on_evict(ev)
            mirror.on_insert(ins)
            mirror.check(h for h, _ in cache)
    ins, ev = cache.take_changes()
    mirror.on_evict(ev)
    mirror.on_insert(ins)
    mirror.check(h for h, _ in cache)
    assert churned and deltas > 10
    cache.clear()
    ins, ev = cache.take_changes()
    assert ins == [] and len(ev) == len(mirror)


def test_reset_recovers_from_a_lost_delta():
    cache = RadixCache()
    mirror = CacheMirror("m")
    cache.take_changes()
    cache.insert([1, 2, 3], [None] * 3)
    cache.take_changes()  # this delta is lost on the way
    cache.insert([1, 2, 3, 4], [None] * 4)
    mirror.on_insert(cache.take_changes()[0])
    with pytest.raises(MirrorDrift):
        mirror.check(h for h, _ in cache)
    mirror.reset(h for h, _ in cache)  # the worker's full listing after a reconnect
    mirror.check(h for h, _ in cache)
    assert mirror.digest == 1 ^ 2 ^ 3 ^ 4 and mirror.match([1, 2, 3, 4, 5]) == 4
