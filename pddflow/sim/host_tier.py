"""A host-memory tier under one instance's KV cache (graph: `operators.X.host_cache`;
docs/simulator.md, Host-memory KV tier).

It holds block hashes, not values: blocks the HBM cache evicts land here (most recent last) and
the least recently evicted leave when it is full. A hit here is loaded back into HBM over the
host-to-HBM link, one load at a time in request order (FIFO), so concurrent loads share its
bandwidth and each request waits for the loads ahead of it plus its own."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import replace

from pddflow.graph.plan import Plan


class HostTier:
    def __init__(self, capacity_blocks: int, s_per_block: float, clock: Callable[[], float]):
        if capacity_blocks <= 0:
            raise ValueError(f"a host tier needs capacity > 0 blocks, got {capacity_blocks}")
        self.capacity = capacity_blocks
        self.s_per_block = s_per_block  # block bytes / link bytes per second
        self.clock = clock
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self._link_free_at = 0.0
        self._arriving: dict[int, float] = {}  # hash -> when its load completes
        self._pins: dict[int, int] = {}  # blocks a decoder counts on loading when its KV lands
        self.loaded_blocks = 0
        self.dropped_blocks = 0
        self.load_s = 0.0  # link time spent loading

    def __len__(self) -> int:
        return len(self.blocks)

    def __contains__(self, h: int) -> bool:
        return h in self.blocks

    def run_of(self, hashes: tuple[int, ...], start: int) -> int:
        """How many of `hashes[start:]`, in order, this tier holds."""
        n = 0
        blocks = self.blocks
        while start + n < len(hashes) and hashes[start + n] in blocks:
            n += 1
        return n

    def take(self, hashes: Iterable[int]) -> None:
        """Remove blocks that move back to HBM (they stay cached: no mirror event)."""
        for h in hashes:
            del self.blocks[h]

    def put(self, hashes: Iterable[int]) -> list[int]:
        """Blocks evicted from HBM (or put back); returns those dropped for room (LRU)."""
        for h in hashes:
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        dropped = []
        while len(self.blocks) > self.capacity:
            # least recently evicted first, never a pinned block (over capacity while all are)
            h = next((h for h in self.blocks if h not in self._pins), None)
            if h is None:
                break
            del self.blocks[h]
            dropped.append(h)
        self.dropped_blocks += len(dropped)
        return dropped

    def pin(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            self._pins[h] = self._pins.get(h, 0) + 1

    def unpin(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            n = self._pins[h] - 1
            if n:
                self._pins[h] = n
            else:
                del self._pins[h]

    def load(self, hashes: list[int]) -> float:
        """Queue the load of `hashes` on the link; returns when it completes."""
        now = self.clock()
        if len(self._arriving) > 4096:  # completed loads are forgotten now and then
            self._arriving = {h: t for h, t in self._arriving.items() if t > now}
        start = max(now, self._link_free_at)
        dur = len(hashes) * self.s_per_block
        end = self._link_free_at = start + dur
        for h in hashes:
            self._arriving[h] = end
        self.loaded_blocks += len(hashes)
        self.load_s += dur
        return end

    def ready_at(self, hashes: Iterable[int]) -> float:
        """When every block of `hashes` (in HBM) has arrived: a block an earlier request is still
        loading is not usable before its load completes."""
        now = self.clock()
        ready = now
        arriving = self._arriving
        if not arriving:
            return ready
        for h in hashes:
            t = arriving.get(h)
            if t is None:
                continue
            if t <= now:
                del arriving[h]
            elif t > ready:
                ready = t
        return ready

    def settle(self) -> None:
        """Loads so far are complete and took no link time (the caches' warm placement happens
        before the run starts)."""
        self._link_free_at = 0.0
        self._arriving.clear()
        self.loaded_blocks = 0
        self.load_s = 0.0


LADDER_STEPS = 3  # the doublings below a tier's max_gib the search and the sweep try, besides 0


def ladder(max_gib: float, steps: int = LADDER_STEPS) -> tuple[float, ...]:
    """Host-tier sizes per replica to try: 0 and `steps` doublings up to `max_gib`
    (512 -> 0, 128, 256, 512). Few on purpose: each is a full evaluation."""
    if max_gib <= 0:
        return (0.0,)
    return (0.0,) + tuple(max_gib / 2**k for k in range(steps - 1, -1, -1))


def with_host_gib(plan: Plan, gib: dict[str, float]) -> Plan:
    """`plan` with these operators' host tiers at these sizes per replica (within each max)."""
    ops = dict(plan.operators)
    for name, g in gib.items():
        op = ops[name]
        if op.host_cache is None:
            raise ValueError(f"operator {name} declares no host_cache to size")
        if g > op.host_cache.max_gib + 1e-9:
            raise ValueError(f"operator {name}: {g:g} GiB is above its max_gib")
        ops[name] = replace(op, host_cache=replace(op.host_cache, gib=float(g)))
    return replace(plan, operators=ops)


def tiered(plan: Plan) -> tuple[str, ...]:
    """Operators whose host tier may be sized (a max above 0)."""
    return tuple(
        n for n, op in plan.operators.items() if op.host_cache and op.host_cache.max_gib > 0
    )
