from pddflow.operators.radix_cache import RadixCache


def test_match_returns_longest_prefix():
    c = RadixCache()
    assert c.insert([1, 2, 3], ["a", "b", "c"]) == [True, True, True]
    assert c.match([1, 2, 3, 4]) == ["a", "b", "c"]
    assert c.match([1, 2, 9]) == ["a", "b"]
    assert c.match([7]) == []
    assert c.match_len([1, 2, 3]) == 3


def test_insert_keeps_existing_values():
    c = RadixCache()
    c.insert([1, 2], ["a", "b"])
    assert c.insert([1, 2, 3], ["x", "y", "z"]) == [False, False, True]
    assert c.match([1, 2, 3]) == ["a", "b", "z"]
    assert len(c) == 3


def test_lru_eviction_is_leaf_first_and_least_recent_first():
    evicted = []
    c = RadixCache(on_evict=lambda _h, v: evicted.append(v))
    c.insert([1, 2, 3], ["a", "b", "c"])  # path A
    c.insert([1, 5], ["a", "e"])  # branch B shares block 1
    c.match([1, 2, 3])  # A is now more recent than B
    assert c.evict(1) == ["e"]  # B's leaf goes first
    assert c.evict(2) == ["c", "b"]  # then A's leaves, deepest first
    assert c.evict(5) == ["a"]
    assert evicted == ["e", "c", "b", "a"] and len(c) == 0


def test_unevictable_blocks_are_kept():
    pinned = {"c"}
    c = RadixCache(evictable=lambda v: v not in pinned)
    c.insert([1, 2, 3], ["a", "b", "c"])
    c.insert([9], ["z"])
    assert c.evict(10) == ["z"]  # "c" pinned, so its ancestors are stuck too
    assert c.evictable_count() == 0
    pinned.clear()
    assert c.evictable_count() == 3
    assert c.evict(10) == ["c", "b", "a"]


def test_match_len_does_not_touch_lru():
    c = RadixCache()
    c.insert([1], ["a"])
    c.insert([2], ["b"])
    c.match_len([1])  # a router peeking must not protect block 1
    assert c.evict(1) == ["a"]


def test_capacity_bounds_a_mirror():
    c = RadixCache(capacity=3)
    c.insert([1, 2], [None, None])
    c.insert([3, 4], [None, None])
    assert len(c) == 3
    assert c.match_len([3, 4]) == 2 and c.match_len([1, 2]) == 1


def test_many_touches_keep_heap_bounded():
    c = RadixCache()
    c.insert([1, 2], ["a", "b"])
    for _ in range(1000):
        c.match([1, 2])
    assert len(c._heap) <= 2 * len(c) + 65


def test_clear_calls_on_evict_for_everything():
    seen = []
    c = RadixCache(on_evict=lambda h, v: seen.append((h, v)))
    c.insert([1, 2], ["a", "b"])
    assert sorted(c.clear()) == ["a", "b"] and sorted(seen) == [(1, "a"), (2, "b")] and len(c) == 0
