"""The disk KV tier in the simulator (graph: `disk_cache`): write-through as the runtime's, so a
block HBM and host memory both dropped is still a hit, loaded at the disk's bandwidth; the mirror
holds the union of the tiers, exactly."""

from __future__ import annotations

import pytest
from test_host_tier import _Clock, _replay, _serve

from pddflow.scheduler import CacheMirror
from pddflow.sim.host_tier import HostTier
from pddflow.sim.kvstore import KVStore


def test_a_block_gone_from_hbm_and_host_memory_comes_back_from_disk():
    clock = _Clock()
    mirror = CacheMirror("d/0")
    host = HostTier(2, s_per_block=0.1, clock=clock)
    disk = HostTier(64, s_per_block=0.5, clock=clock)
    store = KVStore("d/0", 5, True, mirror, strict=True, host=host, disk=disk)
    a, b = (1, 2, 3, 4), (11, 12, 13, 14, 15)
    _serve(store, a)
    _serve(store, b)  # a's four leave HBM; host memory keeps two of them, disk all
    assert len(host) == 2 and all(h in disk for h in a + b)
    assert len(mirror) == 9  # a and b, wherever they are
    clock.now = 10.0
    hold = store.acquire(a + (5,), 0)
    assert (hold.hit, hold.loaded, hold.missing) == (4, 4, 1)
    # two over the host link (0.2 s), two from disk (1.0 s): the slower decides
    assert hold.ready_at == pytest.approx(11.0)
    assert disk.loaded_blocks == 2 and host.loaded_blocks == 2
    store.release(hold)
    store.check_mirror()
    assert all(h in disk for h in a)  # a load copies from disk, it does not move


@pytest.mark.parametrize("seed", range(2))
def test_a_disk_tier_only_adds_hits_and_the_mirror_stays_exact(seed):
    hits = []
    for disk_cap in (0, 32, 256):
        clock = _Clock()
        host = HostTier(8, 0.001, clock)
        disk = HostTier(disk_cap, 0.01, clock) if disk_cap else None
        store = KVStore("d/0", 40, True, CacheMirror("d/0"), strict=True, host=host, disk=disk)
        hits.append(_replay(store, clock, seed))
    assert hits == sorted(hits) and hits[-1] > hits[0], hits
