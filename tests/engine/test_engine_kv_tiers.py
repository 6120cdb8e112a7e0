"""The tiers under the prefix cache (operators/kv_tiers.py, kv_disk.py): blocks the device evicts
come back from host memory or disk with the same bytes, so greedy tokens equal a cache that never
evicted; the disk arena survives its engine and drops what fails its checksum."""

from __future__ import annotations

import os

import pytest
from conftest import small_engine, small_source

from pddflow.core.block_hash import chain_block_hashes
from pddflow.core.payloads import Request, SamplingParams
from pddflow.operators.cache_state import cache_changes, cache_listing
from pddflow.operators.engine import Engine, EngineConfig
from pddflow.operators.kv_disk import ARENA
from pddflow.operators.kv_tiers import DISK, HOST

BLOCK = 2048  # SMALL's block: 2 layers x K,V x 4 tokens x 2 heads x 16 x fp32
GREEDY = SamplingParams(max_tokens=6)


def serve(engine: Engine, turns: int = 3, n: int = 4) -> tuple[list[list[int]], int]:
    """Multi-turn sessions (each turn's prompt: the last one, its answer, new user tokens), the
    sessions of one turn batched; (every output, prompt tokens the cache gave)."""
    prompts = [[(s * 31 + j * 7) % 90 + 1 for j in range(36)] for s in range(n)]
    outs, reused = [], [0]
    adopt = engine.reuse_prefix

    def counted(seq, keep_last=True):
        reused[0] += adopt(seq, keep_last)
        return seq.num_computed

    engine.reuse_prefix = counted
    for t in range(turns):
        done = engine.generate(
            [Request(f"s{s}t{t}", list(p), GREEDY) for s, p in enumerate(prompts)], max_batch=n
        )
        outs += [list(s.output_ids) for s in done]
        prompts = [
            p + s.output_ids + [(t * 11 + k) % 90 + 1 for k in range(9)]
            for p, s in zip(prompts, done)
        ]
    return outs, reused[0]


def tiered(tmp_path, **overrides) -> Engine:
    cfg = dict(
        kv_cache_bytes=48 * BLOCK,
        host_cache_bytes=8 * BLOCK,
        disk_cache_bytes=256 * BLOCK,
        disk_cache_dir=str(tmp_path / "kv"),
    )
    cfg.update(overrides)
    return small_engine(**cfg)


def test_tiered_cache_hits_below_the_device_and_tokens_stay_exact(tmp_path):
    reference, _ = serve(small_engine())  # 4 MiB: nothing is ever evicted
    small = small_engine(kv_cache_bytes=48 * BLOCK)
    small_out, small_reused = serve(small)
    e = tiered(tmp_path)
    out, reused = serve(e)
    assert out == reference == small_out
    assert reused > small_reused  # the blocks the small pool evicted came back from below
    stats = e.tiers.stats
    assert stats["host"].hit_blocks > 0 and stats["disk"].hit_blocks > 0
    assert stats["device"].evicted_blocks > 0 and stats["host"].evicted_blocks > 0
    assert stats["disk"].stored_blocks == len(e.tiers.disk)  # written through, nothing dropped
    e.close()
    assert not (tmp_path / "kv").exists()  # a tier that does not persist leaves no file


def test_the_journal_keeps_a_mirror_of_every_tier_exact(tmp_path):
    e = tiered(tmp_path)
    mirror: dict[int, int] = {}
    for h, tier in cache_changes(e.radix, e.tiers)[0]:
        mirror[h] = tier
    prompts = [[(s * 17 + j) % 90 + 1 for j in range(40)] for s in range(6)]
    for round_ in range(3):
        e.generate([Request(f"r{round_}s{i}", p, GREEDY) for i, p in enumerate(prompts)])
        inserted, evicted, moved = cache_changes(e.radix, e.tiers)
        for h in evicted:
            del mirror[h]
        for h, tier in inserted:
            assert h not in mirror
            mirror[h] = tier
        for h, tier in moved:
            assert h in mirror
            mirror[h] = tier
        assert sorted(mirror.items()) == cache_listing(e.radix, e.tiers)
    tiers = set(mirror.values())
    assert HOST in tiers or DISK in tiers
    e.close()


def test_a_new_engine_reopens_the_disk_arena_and_hits_it(tmp_path):
    reference, _ = serve(small_engine(), turns=2)
    first = tiered(tmp_path, host_cache_bytes=0)
    serve(first, turns=1)
    listed = len(first.tiers.disk)
    # no close(): as after kill -9, the arena is all the next engine finds
    again = tiered(tmp_path, host_cache_bytes=0)
    assert again.tiers.disk.reopened == listed and len(again.radix) == 0
    assert {t for _, t in cache_listing(again.radix, again.tiers)} == {DISK}
    out, reused = serve(again, turns=2)
    assert out == reference and reused > 0
    assert again.tiers.stats["disk"].hit_blocks > 0
    again.close()


def test_a_corrupt_disk_block_is_dropped_on_open_and_on_read(tmp_path):
    reference, _ = serve(small_engine(), turns=2)
    first = tiered(tmp_path, host_cache_bytes=0)
    serve(first, turns=1)
    disk = first.tiers.disk
    slots = sorted(disk.slots.values())
    arena = tmp_path / "kv" / ARENA
    with open(arena, "r+b") as f:  # one flipped byte in the payload of the first slot
        f.seek(slots[0] * disk.slot_bytes + 100)
        b = f.read(1)
        f.seek(slots[0] * disk.slot_bytes + 100)
        f.write(bytes([b[0] ^ 0x40]))
    again = tiered(tmp_path, host_cache_bytes=0)
    assert again.tiers.disk.corrupt_dropped == 1
    assert len(again.tiers.disk) == len(disk) - 1
    # corrupt another one after the open: found when a hit reads it, dropped, recomputed
    session3 = [(3 * 31 + j * 7) % 90 + 1 for j in range(4)]
    victim = again.tiers.disk.slots[chain_block_hashes(session3, 4, None)[0]]
    fd = os.open(arena, os.O_RDWR)
    os.pwrite(fd, b"\xff\xff", victim * disk.slot_bytes + 64)
    os.close(fd)
    out, _ = serve(again, turns=2)
    assert out == reference
    assert again.tiers.disk.corrupt_dropped == 2
    again.close()


def test_an_arena_from_other_weights_is_discarded(tmp_path):
    first = tiered(tmp_path, host_cache_bytes=0)
    serve(first, turns=1)
    assert len(first.tiers.disk) > 0
    other = Engine(
        small_source(seed=1),
        EngineConfig(
            block_size=4,
            attention_tile=16,
            chunk_size=64,
            kv_cache_bytes=48 * BLOCK,
            disk_cache_bytes=256 * BLOCK,
            disk_cache_dir=str(tmp_path / "kv"),
        ),
    )
    assert len(other.tiers.disk) == 0 and other.tiers.disk.reopened == 0
    other.close()


def test_persisting_tier_keeps_its_arena_after_close(tmp_path):
    e = tiered(tmp_path, disk_cache_persist=True)
    serve(e, turns=1)
    e.close()
    assert (tmp_path / "kv" / ARENA).exists()


def test_tiers_need_a_prefix_cache():
    with pytest.raises(ValueError, match="prefix cache"):
        small_engine(prefix_cache=False, host_cache_bytes=8 * BLOCK)
