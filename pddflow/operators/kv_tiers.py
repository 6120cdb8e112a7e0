"""The tiers under an engine's device radix cache: host memory, then local disk (graph:
`host_cache`, `disk_cache`; docs/engine.md, Tiered cache).

Inclusion policy: the host tier is a victim cache, exclusive of the device (a block the device
evicts is copied down; one loaded back up leaves host memory, so the two hold the most distinct
blocks; the simulator's host tier behaves the same); the disk tier is write-through (every block
the device caches is written once), so a worker killed without warning leaves its whole cache on
disk for the next one. Each tier evicts least-recently-used on its own;
a chained hash names its whole prefix, so a lower tier is a flat map, not a tree.

The journal reports, per block, the fastest tier holding it: the router's mirror is the union of
the tiers, each block tagged with where a hit on it would be loaded from."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import xxhash

from pddflow.core.cache_tiers import DEVICE, DISK, HOST, TIER_NAMES
from pddflow.operators.cache_state import NO_LOAD, TierLoad
from pddflow.operators.kv_disk import DiskTier
from pddflow.operators.kv_slots import TierSlots

_BIT = (1, 2, 4)


def fastest(mask: int) -> int | None:
    for tier, bit in enumerate(_BIT):
        if mask & bit:
            return tier
    return None


@dataclass
class TierStats:
    hit_blocks: int = 0  # blocks loaded from this tier into device blocks
    loaded_bytes: int = 0
    load_s: float = 0.0
    stored_blocks: int = 0  # blocks written into this tier
    evicted_blocks: int = 0  # blocks this tier dropped for room


class HostArena(TierSlots):
    """Blocks in one host-memory arena (pinned when the device is a GPU, for fast copies)."""

    def __init__(self, capacity_blocks: int, block_shape: tuple[int, ...], dtype, pin: bool):
        super().__init__(capacity_blocks, "host-memory")
        self.arena = torch.empty((capacity_blocks, *block_shape), dtype=dtype, pin_memory=pin)

    def put(self, h: int, block: torch.Tensor) -> int | None:
        """Copy one block in; returns the hash dropped for room."""
        slot, dropped = self.claim(h)
        if slot is not None:
            self.arena[slot].copy_(block)
        return dropped

    def read(self, h: int) -> torch.Tensor:
        self.slots.move_to_end(h)
        return self.arena[self.slots[h]]


class KVTiers:
    """`pool`: the device KV pool tensor [blocks, ...]; a block's tier copies have its shape."""

    def __init__(self, pool: torch.Tensor, host: HostArena | None, disk: DiskTier | None):
        self.pool = pool
        self.host, self.disk = host, disk
        self.stats = {name: TierStats() for name in TIER_NAMES}
        self._mask: dict[int, int] = {}
        if disk is not None:
            self._mask = dict.fromkeys(disk.slots, _BIT[DISK])
        self._journal: dict[int, int] | None = None  # hash -> its mask before the first change

    # -- events from the device cache ------------------------------------------------------
    def device_inserted(self, pairs: Iterable[tuple[int, int]]) -> None:
        """(hash, device block) the radix cache stored: written through to disk, and out of host
        memory if it was there (exclusive)."""
        for h, block in pairs:
            self._set(h, DEVICE)
            if self.host is not None and h in self.host:  # computed again: one copy, on device
                self.host.release(h)
                self._clear(h, HOST)
            if self.disk is not None and h not in self.disk:
                self._stored(DISK, self.disk.put(h, self._bytes(block)))
                self._set(h, DISK)

    def device_evicted(self, h: int, block: int) -> None:
        """Called before the device block is freed: its bytes are still there to copy down."""
        self._clear(h, DEVICE)
        self.stats["device"].evicted_blocks += 1
        if self.host is not None:  # exclusive: it is not there yet
            self._stored(HOST, self.host.put(h, self.pool[block]))
            self._set(h, HOST)

    def _stored(self, tier: int, dropped: int | None) -> None:
        s = self.stats[TIER_NAMES[tier]]
        s.stored_blocks += 1
        if dropped is not None:
            s.evicted_blocks += 1
            self._clear(dropped, tier)

    # -- hits below the device ---------------------------------------------------------------
    def run(self, hashes: list[int], start: int) -> int:
        """How many of hashes[start:], in order, a lower tier holds."""
        n, mask, below = 0, self._mask, _BIT[HOST] | _BIT[DISK]
        while start + n < len(hashes) and mask.get(hashes[start + n], 0) & below:
            n += 1
        return n

    def read(self, hashes: list[int]) -> tuple[torch.Tensor, dict[str, int]]:
        """The leading blocks of `hashes` the lower tiers yield, staged in host memory (a corrupt
        disk block ends the run and is dropped), and how many came from each tier."""
        staged: list[torch.Tensor] = []
        per: dict[str, int] = {}
        from_host: list[int] = []
        shape, dtype = self.pool.shape[1:], self.pool.dtype
        for h in hashes:
            tier = fastest(self._mask.get(h, 0) & ~_BIT[DEVICE])
            if tier == HOST:
                block = self.host.read(h)  # type: ignore[union-attr]
                from_host.append(h)
            elif tier == DISK:
                raw = self.disk.read(h)  # type: ignore[union-attr]
                if raw is None:  # checksum failed: dropped, the caller recomputes from here
                    self._clear(h, DISK)
                    break
                block = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(shape)
            else:
                break
            staged.append(block)
            per[TIER_NAMES[tier]] = per.get(TIER_NAMES[tier], 0) + 1
        out = torch.stack(staged) if staged else self.pool.new_empty((0, *shape), device="cpu")
        for h in from_host:  # copied out above: the device holds them next (exclusive)
            self.host.release(h)  # type: ignore[union-attr]
            self._clear(h, HOST)
        return out, per

    def loaded(self, per: dict[str, int], seconds: float) -> TierLoad:
        """Account one adoption's load (read and copy into device blocks, `seconds` in all)."""
        total = sum(per.values())
        for name, n in per.items():
            s = self.stats[name]
            s.hit_blocks += n
            s.loaded_bytes += n * self.block_bytes
            s.load_s += seconds * n / total
        return TierLoad(per, seconds)

    @property
    def block_bytes(self) -> int:
        return self.pool[0].numel() * self.pool.element_size()

    # -- the mirror's journal ----------------------------------------------------------------
    def tier_of(self, h: int) -> int | None:
        return fastest(self._mask.get(h, 0))

    def held(self) -> Iterable[int]:
        """Every block held in some tier, in no order."""
        return self._mask.keys()

    def listing(self) -> list[tuple[int, int]]:
        """(hash, fastest tier) of every block held, sorted."""
        return sorted((h, fastest(m)) for h, m in self._mask.items())  # type: ignore[misc]

    def take_changes(self) -> tuple[list[tuple[int, int]], list[int], list[tuple[int, int]]]:
        """Net (inserted, evicted, moved) since the previous call, by the fastest tier holding
        each block: inserted and moved as (hash, tier). The first call starts the journal and
        lists every block held as inserted."""
        if self._journal is None:
            self._journal = {}
            return self.listing(), [], []
        inserted, evicted, moved = [], [], []
        for h, before in self._journal.items():
            was, now = fastest(before), self.tier_of(h)
            if was is None and now is not None:
                inserted.append((h, now))
            elif was is not None and now is None:
                evicted.append(h)
            elif was != now:
                moved.append((h, now))
        self._journal = {}
        return sorted(inserted), sorted(evicted), sorted(moved)  # type: ignore[arg-type]

    def _note(self, h: int) -> None:
        if self._journal is not None and h not in self._journal:
            self._journal[h] = self._mask.get(h, 0)

    def _set(self, h: int, tier: int) -> None:
        self._note(h)
        self._mask[h] = self._mask.get(h, 0) | _BIT[tier]

    def _clear(self, h: int, tier: int) -> None:
        self._note(h)
        m = self._mask.get(h, 0) & ~_BIT[tier]
        if m:
            self._mask[h] = m
        else:
            self._mask.pop(h, None)

    def _bytes(self, block: int) -> np.ndarray:
        """One device block's bytes in host memory."""
        return self.pool[block].contiguous().view(torch.uint8).cpu().numpy().reshape(-1)

    def close(self, remove_disk: bool) -> None:
        if self.disk is not None:
            self.disk.close(remove_disk)


def load_run(engine, seq, blocks: int) -> TierLoad:
    """Load into new device blocks the run of `seq`'s first `blocks` blocks, after those it holds,
    that the engine's tiers hold; they join its block table and the device cache."""
    tiers, bs = engine.tiers, engine.block_size
    hashes = seq.block_hashes(bs, blocks * bs)
    start = seq.num_computed // bs
    if start >= len(hashes) or seq.num_computed % bs or len(seq.block_table) != start:
        return NO_LOAD
    run = tiers.run(hashes, start)
    if not run:
        return NO_LOAD
    t0 = time.perf_counter()
    data, per = tiers.read(hashes[start : start + run])
    if data.shape[0]:
        new = engine._allocate(data.shape[0], seq.seq_id)
        engine.pool.tensor[torch.tensor(new, device=engine.device)] = data.to(engine.device)
        seq.block_table += new
        seq.num_computed += len(new) * bs
        engine.cache_sequence(seq)
    return tiers.loaded(per, time.perf_counter() - t0)


def weights_fingerprint(weights: dict[str, torch.Tensor]) -> str:
    """Names, shapes and a sample of every tensor's bytes: KV written under other weights (another
    checkpoint, another seed of a built-in model) must never be read back."""
    x = xxhash.xxh3_64()
    for name in sorted(weights):
        t = weights[name].detach().reshape(-1)
        x.update(f"{name}:{tuple(weights[name].shape)}:{t.dtype};".encode())
        for part in (t[:64], t[-64:]):
            x.update(part.float().cpu().numpy().tobytes())
    return x.hexdigest()


def for_engine(config, source, pool: torch.Tensor, tp) -> KVTiers | None:
    """The tiers an EngineConfig asks for, under the engine's pool; None when it asks for none."""
    if not (config.host_cache_bytes or config.disk_cache_bytes):
        return None
    if tp is not None or not config.prefix_cache:
        raise ValueError(
            "KV tiers (host_cache, disk_cache) sit under the prefix cache of a single-rank "
            "engine; this one is tensor-parallel or caches no prefixes"
        )
    identity = {
        "weights": weights_fingerprint(source.weights),
        "block": list(pool.shape[1:]),
        "dtype": str(pool.dtype),
    }
    return open_tiers(
        pool, config.host_cache_bytes, config.disk_cache_bytes, config.disk_cache_dir, identity
    )


def open_tiers(
    pool: torch.Tensor,
    host_bytes: int,
    disk_bytes: int,
    disk_dir: str,
    identity: dict,
) -> KVTiers:
    """The tiers a config asks for under `pool` (capacities in whole blocks of its shape)."""
    block = pool[0]
    nbytes = block.numel() * block.element_size()
    host = disk = None
    if host_bytes:
        pin = pool.device.type == "cuda"
        host = HostArena(host_bytes // nbytes, tuple(block.shape), pool.dtype, pin)
    if disk_bytes:
        if not disk_dir:
            raise ValueError("a disk tier needs a directory (disk_cache.dir)")
        disk = DiskTier(Path(disk_dir), disk_bytes // nbytes, nbytes, identity)
    return KVTiers(pool, host, disk)
