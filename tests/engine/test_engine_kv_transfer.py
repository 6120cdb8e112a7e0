"""KV export/import: a sequence's blocks leave one engine as one contiguous KVBlocks buffer and land
in fresh blocks of another, which then decodes exactly as the colocated run would."""

import numpy as np
import pytest
import torch
from conftest import SMALL, small_engine

from pddflow.core.payloads import KVBlocks, SamplingParams

PROMPT = [(7 * i + 3) % SMALL.vocab_size for i in range(37)]  # 9 full blocks of 4 + 1 partial


def colocated(n: int) -> list[int]:
    return small_engine().generate([PROMPT], SamplingParams(max_tokens=n))[0].output_ids


def test_export_layout_and_round_trip():
    src, dst = small_engine(), small_engine()
    seq = src.add_sequence(PROMPT, SamplingParams(max_tokens=8))
    first = src.prefill(seq)
    kv = src.export_kv(seq)
    c = SMALL
    assert kv.data.shape == (10, c.num_layers, 2, 4, c.num_kv_heads, c.head_dim)
    assert kv.data.is_contiguous() and kv.token_start == 0 and kv.token_end == len(PROMPT)
    assert kv.num_blocks == 10 and kv.block_hashes[:9] == seq.block_hashes(4)
    # the buffer is exactly the pool's blocks
    assert torch.equal(kv.data, src.pool.tensor[seq.block_table])

    got = dst.add_sequence(PROMPT, SamplingParams(max_tokens=8))
    dst.import_kv(got, kv)
    assert got.num_computed == len(PROMPT)
    assert torch.equal(dst.pool.tensor[got.block_table], kv.data)
    dst.append_tokens(got, [first])
    while not got.finished:
        dst.decode([got])
    assert got.output_ids == colocated(8)
    assert dst.match(seq.block_hashes(4)) == 9, "imported full blocks are cached on the receiver"


def test_import_accepts_numpy_buffers():
    src, dst = small_engine(), small_engine()
    seq = src.add_sequence(PROMPT, SamplingParams(max_tokens=5))
    first = src.prefill(seq)
    kv = src.export_kv(seq)
    wire = KVBlocks(
        kv.seq_id, kv.block_hashes, kv.token_start, kv.token_end, kv.block_size, kv.data.numpy()
    )
    got = dst.add_sequence(PROMPT, SamplingParams(max_tokens=5))
    dst.import_kv(got, wire, cache=False)
    dst.append_tokens(got, [first])
    while not got.finished:
        dst.decode([got])
    assert got.output_ids == colocated(5)
    assert len(dst.radix) == 0


def test_export_only_missing_blocks():
    src, dst = small_engine(), small_engine()
    # an earlier turn: 5 blocks cached
    warm = dst.add_sequence(PROMPT[:20], SamplingParams(max_tokens=1))
    dst.prefill(warm)
    dst.free(warm)
    seq = src.add_sequence(PROMPT, SamplingParams(max_tokens=6))
    first = src.prefill(seq)
    got = dst.add_sequence(PROMPT, SamplingParams(max_tokens=6))
    hit = dst.reuse_prefix(got, keep_last=False)
    assert hit == 20
    kv = src.export_kv(seq, start_block=hit // 4)
    assert kv.token_start == 20 and kv.num_blocks == 5 and kv.data.shape[0] == 5
    dst.import_kv(got, kv)
    dst.append_tokens(got, [first])
    while not got.finished:
        dst.decode([got])
    assert got.output_ids == colocated(6)


def test_import_rejects_kv_of_another_prefix():
    src, dst = small_engine(), small_engine()
    seq = src.add_sequence(PROMPT, SamplingParams(max_tokens=2))
    src.prefill(seq)
    kv = src.export_kv(seq)
    other = dst.add_sequence([1] + PROMPT[1:], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="hash mismatch"):
        dst.import_kv(other, kv)
    assert dst.allocator.num_used == 0


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda kv: setattr(kv, "block_size", 8), "block size"),
        (lambda kv: setattr(kv, "token_start", 4), "starts at token"),
        (lambda kv: setattr(kv, "data", kv.data[:3]), "needs 10 blocks"),
    ],
)
def test_import_validates(mutate, message):
    src, dst = small_engine(), small_engine()
    seq = src.add_sequence(PROMPT, SamplingParams(max_tokens=2))
    src.prefill(seq)
    kv = src.export_kv(seq)
    mutate(kv)
    with pytest.raises(ValueError, match=message):
        dst.import_kv(dst.add_sequence(PROMPT), kv)


def test_export_range_and_partial_block_hash():
    e = small_engine()
    seq = e.add_sequence(PROMPT, SamplingParams(max_tokens=2))
    e.prefill(seq)
    part = e.export_kv(seq, 2, 5)
    assert (part.token_start, part.token_end, part.num_blocks) == (8, 20, 3)
    tail = e.export_kv(seq, 9)
    assert (tail.token_start, tail.token_end, tail.num_blocks) == (36, 37, 1)
    assert tail.block_hashes[0] not in seq.block_hashes(4)
    with pytest.raises(ValueError):
        e.export_kv(seq, 5, 2)


def test_numpy_roundtrip_dtype():
    e = small_engine()
    seq = e.add_sequence(PROMPT, SamplingParams(max_tokens=2))
    e.prefill(seq)
    assert e.export_kv(seq).data.numpy().dtype == np.float32
