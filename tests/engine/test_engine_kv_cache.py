import pytest
from conftest import small_engine

from pddflow.core.payloads import Request, SamplingParams
from pddflow.operators.block_allocator import BlockAllocator, KVCacheFull


def test_allocator_refcounts():
    a = BlockAllocator(4)
    blocks = a.allocate(3)
    a.incref(blocks[:1])
    a.decref(blocks)
    assert a.num_free == 3 and a.refcount(blocks[0]) == 1
    a.decref(blocks[:1])
    assert a.num_free == 4
    with pytest.raises(RuntimeError, match="double free"):
        a.decref(blocks[:1])
    with pytest.raises(KVCacheFull, match="needs 5 blocks, 4 free of 4"):
        a.allocate(5)


def test_request_that_can_never_fit_is_a_clear_error():
    e = small_engine(kv_cache_bytes=64 * 1024)  # 64 KiB: a handful of 4-token blocks
    total = e.allocator.num_blocks
    with pytest.raises(KVCacheFull, match="can never fit") as info:
        e.generate([list(range(10)) * 20], SamplingParams(max_tokens=8))
    assert info.value.total == total and info.value.needed > total
    assert e.allocator.num_used == 0


def test_prefill_beyond_budget_raises_without_corrupting_state():
    e = small_engine(kv_cache_bytes=64 * 1024)
    seq = e.add_sequence(list(range(10)) * 20, SamplingParams(max_tokens=1))
    with pytest.raises(KVCacheFull, match="KV cache full"):
        e.prefill(seq)
    e.free(seq)
    e.radix.clear()
    assert e.allocator.num_free == e.allocator.num_blocks


def test_admission_waits_for_memory_instead_of_failing():
    e = small_engine(kv_cache_bytes=256 * 1024)
    blocks = e.allocator.num_blocks
    # each request needs ~40% of the cache: at most two run at once, all complete
    plen = int(blocks * 4 * 0.3)
    reqs = [
        Request(
            f"r{i}",
            [(i * 13 + j) % 90 for j in range(plen)],
            SamplingParams(max_tokens=int(blocks * 0.4)),
        )
        for i in range(5)
    ]
    peak = []
    outs = e.generate(reqs, max_batch=5, on_step=lambda running: peak.append(len(running)))
    assert all(len(s.output_ids) == r.sampling.max_tokens for s, r in zip(outs, reqs))
    assert max(peak) <= 2
    e.radix.clear()
    assert e.allocator.num_free == blocks


def test_cached_blocks_are_evicted_when_memory_is_needed():
    # A block: 2 layers x (K, V) x 2 KV heads x 16 dims x 4 bytes x 4 tokens = 2 KiB; 64 fit.
    e = small_engine(kv_cache_bytes=128 * 1024)
    assert e.allocator.num_blocks == 64
    prompts = [[(i * 31 + j) % 90 for j in range(40)] for i in range(10)]
    for p in prompts:  # each turn leaves its 10 full prompt blocks cached: 100 in all
        e.generate([p], SamplingParams(max_tokens=4))
    hashes = [e.add_sequence(p).block_hashes(4) for p in prompts]
    assert e.match(hashes[0]) == 0, "the least recently used turn made room"
    assert e.match(hashes[-1]) == 10
    assert e.allocator.num_used == len(e.radix) <= 64


def test_budget_and_block_geometry():
    import torch

    from pddflow.core.model_config import TINY_LLAMA
    from pddflow.operators.kv_cache import block_bytes, blocks_for_budget

    assert block_bytes(TINY_LLAMA, 16, torch.float32) == 16 * 32 * 1024
    assert blocks_for_budget(TINY_LLAMA, 16, torch.float32, 2**30) == 2048
    assert block_bytes(TINY_LLAMA, 16, torch.bfloat16) == 16 * 16 * 1024
