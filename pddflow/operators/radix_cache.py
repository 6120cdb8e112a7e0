"""Radix prefix cache of hash -> opaque value, pure Python. A tree although a chained hash names its
whole prefix: evicting an inner block would strand its descendants, so eviction goes leaf-first."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any


class _Node:
    __slots__ = ("hash", "value", "parent", "children", "last_access")

    def __init__(self, hash_: int | None, value: Any, parent: _Node | None, last_access: int):
        self.hash = hash_
        self.value = value
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.last_access = last_access


class RadixCache:
    """`capacity` None: the owner calls `evict`. `evictable(v)` False: a sequence reads it.
    `on_evict(hash, value)` runs for each block leaving the cache."""

    def __init__(
        self,
        capacity: int | None = None,
        on_evict: Callable[[int, Any], None] | None = None,
        evictable: Callable[[Any], bool] | None = None,
    ):
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._on_evict = on_evict
        self._evictable = evictable or (lambda _value: True)
        self._clock = itertools.count(1)
        self._root = _Node(None, None, None, 0)
        self._size = 0
        # leaves by last access, lazily deleted: stale entries are skipped on pop and compacted
        self._heap: list[tuple[int, int, _Node]] = []
        self._tiebreak = itertools.count()
        # net (inserted, evicted) since take_changes(), once asked for: O(change) mirror updates
        self._changes: tuple[set[int], set[int]] | None = None

    def __len__(self) -> int:
        return self._size

    def match_len(self, hashes: Sequence[int]) -> int:
        """Leading blocks of `hashes` cached; read-only: predicting a hit must not touch the LRU."""
        node, n = self._root, 0
        for h in hashes:
            node = node.children.get(h)  # type: ignore[assignment]
            if node is None:
                break
            n += 1
        return n

    def match(self, hashes: Sequence[int], touch: bool = True) -> list[Any]:
        """Values of the longest cached prefix of `hashes`; `touch` marks them recently used."""
        path = self._walk(hashes)
        if touch and path:
            self._touch(path)
        return [n.value for n in path]

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            yield node.hash, node.value  # type: ignore[misc]
            stack.extend(node.children.values())

    def insert(self, hashes: Sequence[int], values: Sequence[Any]) -> list[bool]:
        """Per block, whether this call stored its value (False: cached, the caller keeps it)."""
        if len(hashes) != len(values):
            raise ValueError(f"{len(hashes)} hashes but {len(values)} values")
        stored: list[bool] = []
        node = self._root
        path: list[_Node] = []
        for h, v in zip(hashes, values):
            child = node.children.get(h)
            if child is None:
                child = _Node(h, v, node, 0)
                node.children[h] = child
                self._size += 1
                self._note(h, inserted=True)
                stored.append(True)
            else:
                stored.append(False)
            path.append(child)
            node = child
        if path:
            self._touch(path)
        if self.capacity is not None and self._size > self.capacity:
            self.evict(self._size - self.capacity)
        return stored

    def evict(self, num_blocks: int) -> list[Any]:
        evicted: list[Any] = []
        held: list[tuple[int, int, _Node]] = []
        while len(evicted) < num_blocks and self._heap:
            entry = heapq.heappop(self._heap)
            t, _, node = entry
            if node.parent is None or node.children or t != node.last_access:
                continue  # stale: gone, no longer a leaf, or touched since
            if not self._evictable(node.value):
                held.append(entry)
                continue
            parent = node.parent
            del parent.children[node.hash]  # type: ignore[arg-type]
            node.parent = None
            self._size -= 1
            self._note(node.hash, inserted=False)  # type: ignore[arg-type]
            evicted.append(node.value)
            if self._on_evict is not None:
                self._on_evict(node.hash, node.value)
            if parent is not self._root and not parent.children:
                self._push_leaf(parent)
        for entry in held:
            heapq.heappush(self._heap, entry)
        return evicted

    def evictable_count(self) -> int:
        """Blocks repeated `evict` calls could free now. O(size): not for per-token paths."""
        count = 0
        order: list[_Node] = []
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(node.children.values())
        free_subtree: dict[int, bool] = {}
        for node in reversed(order):
            ok = self._evictable(node.value) and all(
                free_subtree[id(c)] for c in node.children.values()
            )
            free_subtree[id(node)] = ok
            count += ok
        return count

    def clear(self) -> list[Any]:
        pairs = list(self)
        if self._changes is not None:
            for h, _ in pairs:
                self._note(h, inserted=False)
        if self._on_evict is not None:
            for h, v in pairs:
                self._on_evict(h, v)
        values = [v for _, v in pairs]
        self._root.children.clear()
        self._size = 0
        self._heap.clear()
        return values

    def take_changes(self) -> tuple[list[int], list[int]]:
        """Net (inserted, evicted) since the previous call (apply `evicted` first); the first call
        starts the journal and returns every cached hash as inserted."""
        if self._changes is None:
            self._changes = (set(), set())
            return sorted(h for h, _ in self), []
        ins, ev = self._changes
        self._changes = (set(), set())
        return sorted(ins), sorted(ev)

    def _note(self, h: int, inserted: bool) -> None:
        if self._changes is None:
            return
        ins, ev = self._changes
        if inserted:
            if h in ev:
                ev.discard(h)
            else:
                ins.add(h)
        elif h in ins:
            ins.discard(h)
        else:
            ev.add(h)

    def _walk(self, hashes: Sequence[int]) -> list[_Node]:
        path: list[_Node] = []
        node = self._root
        for h in hashes:
            child = node.children.get(h)
            if child is None:
                break
            path.append(child)
            node = child
        return path

    def _touch(self, path: list[_Node]) -> None:
        t = next(self._clock)
        for node in path:
            node.last_access = t
        last = path[-1]
        if not last.children:
            self._push_leaf(last)
        if len(self._heap) > 2 * self._size + 64:
            self._compact()

    def _push_leaf(self, node: _Node) -> None:
        heapq.heappush(self._heap, (node.last_access, next(self._tiebreak), node))

    def _compact(self) -> None:
        self._heap = [
            (node.last_access, next(self._tiebreak), node)
            for node in self._iter_nodes()
            if not node.children
        ]
        heapq.heapify(self._heap)

    def _iter_nodes(self) -> Iterator[_Node]:
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
