"""Codecs: KVBlocks <-> Arrow, TokenIds/control <-> protobuf. Bit-exact, no pickle, corrupt blocks
rejected."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pddflow.channels import codec_kv, kv_checksum, kv_landing, kv_layout
from pddflow.channels.errors import ChannelCorrupt, ChannelError
from pddflow.channels.proto import pddflow_pb2 as pb
from pddflow.channels.token_ids import codec as token_codec
from pddflow.core.payloads import KVBlocks, TokenIds

# kv_factory's default block: 4 layers x (K, V) x 16 tokens x 2 heads x 32 dims x 2 bytes
BLOCK_BYTES = 4 * 2 * 16 * 2 * 32 * 2


@pytest.mark.parametrize(
    "torch_dtype, checksum", [("bfloat16", "xxh3_64"), ("float16", "crc32"), (None, "xxh3_64")]
)
def test_kv_ipc_round_trip_is_bit_exact(kv_factory, torch_dtype, checksum, no_pickle):
    kv = kv_factory(num_blocks=7, torch_dtype=torch_dtype)
    buf = codec_kv.encode_ipc(kv, max_batch_bytes=3 * BLOCK_BYTES, checksum=checksum)
    out = kv_landing.decode_ipc(buf)
    assert type(out.data) is type(kv.data)
    assert out.data.dtype == kv.data.dtype and tuple(out.data.shape) == tuple(kv.data.shape)
    assert kv_layout.block_rows(out.data).tobytes() == kv_layout.block_rows(kv.data).tobytes()
    assert (out.seq_id, out.block_hashes, out.token_start, out.token_end, out.block_size) == (
        kv.seq_id,
        kv.block_hashes,
        kv.token_start,
        kv.token_end,
        kv.block_size,
    )


def test_schema_columns_and_self_description(kv_factory):
    kv = kv_factory(num_blocks=3, torch_dtype=None)
    src = codec_kv.KVSource.of(kv)
    batch = next(src.batches())
    assert batch.schema.names == [
        "block_index",
        "block_hash",
        "token_start",
        "token_end",
        "checksum",
        "kv",
    ]
    meta = codec_kv.schema_meta(batch.schema)
    assert meta["seq_id"] == kv.seq_id and meta["layout"]["block_shape"] == list(kv.data.shape[1:])
    # the last block is partial: its token range ends at token_end
    assert batch.column("token_end").to_pylist()[-1] == kv.token_end


def test_encoding_is_zero_copy(kv_factory):
    kv = kv_factory(num_blocks=4, torch_dtype=None)
    batch = next(codec_kv.KVSource.of(kv).batches())
    kv_buf = batch.column("kv").buffers()[1]
    assert kv_buf.address == kv.data.ctypes.data  # the Arrow buffer is the tensor's memory
    view = codec_kv.view_batch(batch)
    assert np.shares_memory(view.data, kv.data) or view.data.ctypes.data == kv_buf.address


def test_torch_view_is_zero_copy(kv_factory):
    import torch

    kv = kv_factory(num_blocks=3, torch_dtype="bfloat16")
    batch = next(codec_kv.KVSource.of(kv).batches())
    view = codec_kv.view_batch(batch)
    assert isinstance(view.data, torch.Tensor) and view.data.data_ptr() == kv.data.data_ptr()
    assert view.data.dtype == torch.bfloat16 and view.data.shape == kv.data.shape


def test_signed_and_unsigned_hashes_round_trip(kv_factory):
    kv = kv_factory(num_blocks=3, torch_dtype=None)
    for hashes in ([-1, 2, -(2**63)], [2**64 - 1, 0, 2**63]):
        kv.block_hashes = hashes
        assert kv_landing.decode_ipc(codec_kv.encode_ipc(kv)).block_hashes == hashes
    kv.block_hashes = [-1, 2**64 - 1, 0]
    with pytest.raises(ChannelError):
        codec_kv.KVSource.of(kv)


def test_checksum_mismatch_is_rejected_not_decoded(kv_factory):
    kv = kv_factory(num_blocks=5, torch_dtype=None)
    src = codec_kv.KVSource.of(kv)
    good = list(src.batches(max_batch_bytes=1))  # one block per batch
    # corrupt block 3's bytes (a copy, so the source stays intact)
    b = good[3]
    assert codec_kv.schema_meta(b.schema)["checksum"] == "xxh3_64"
    bad_bytes = bytearray(b.column("kv").buffers()[1].to_pybytes())
    bad_bytes[100] ^= 0x01
    bad_col = pa.Array.from_buffers(
        b.schema.field("kv").type, 1, [None, pa.py_buffer(bytes(bad_bytes))]
    )
    bad = pa.RecordBatch.from_arrays([b.column(i) for i in range(5)] + [bad_col], schema=b.schema)
    with pytest.raises(ChannelCorrupt) as err:
        kv_landing.decode_kv(good[:3] + [bad] + good[4:])
    assert err.value.bad_blocks == [3]
    with pytest.raises(ChannelCorrupt):
        codec_kv.view_batch(bad)
    landing = kv_landing.KVLanding.from_meta(codec_kv.schema_meta(b.schema))
    accepted, rejected = landing.land(codec_kv.BatchBlocks.of(bad, BLOCK_BYTES))
    assert (accepted, rejected) == ([], [3]) and not landing.landed[3]


def test_checksum_covers_metadata(kv_factory):
    """A block moved to another index (or given another hash) fails its checksum."""
    kv = kv_factory(num_blocks=2, torch_dtype=None)
    b = next(codec_kv.KVSource.of(kv).batches(max_batch_bytes=1))
    moved = pa.RecordBatch.from_arrays(
        [pa.array([1], pa.uint32())] + [b.column(i) for i in range(1, 6)], schema=b.schema
    )
    assert not codec_kv.BatchBlocks.of(moved, BLOCK_BYTES).verify("xxh3_64").any()


@pytest.mark.parametrize("alg", sorted(kv_checksum.CHECKSUMS))
def test_checksum_catches_every_bit_flip_and_short_burst(alg):
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, size=4096 + 5, dtype=np.uint8)  # a tail that is not a whole word
    meta = (3, 12345, 0, 16)
    base = kv_checksum.CHECKSUMS[alg](meta, data)
    for bit in range(0, data.size * 8, 7):  # single bit flips everywhere, tail included
        d = data.copy()
        d[bit // 8] ^= 1 << (bit % 8)
        assert kv_checksum.CHECKSUMS[alg](meta, d) != base
    width = 64 if alg == "xxh3_64" else 32
    for start in range(0, 4096 * 8 - width, 997):  # bursts that straddle word boundaries
        d = np.unpackbits(data, bitorder="little")
        d[start : start + width] ^= (
            rng.integers(0, 2, size=width, dtype=np.uint8) | np.eye(1, width, 0, dtype=np.uint8)[0]
        )
        assert kv_checksum.CHECKSUMS[alg](meta, np.packbits(d, bitorder="little")) != base
    assert kv_checksum.CHECKSUMS[alg]((4, 12345, 0, 16), data) != base  # metadata is covered


@pytest.mark.parametrize("alg", sorted(kv_checksum.CHECKSUMS))
def test_checksum_catches_top_bit_flips_in_two_words(alg):
    """The old default, xsum64 (sum of (2k + 1) x word_k mod 2^64), missed every such pair: each
    flip adds 2^63 times an odd weight, so two add a multiple of 2^64."""
    data = np.random.default_rng(7).integers(0, 256, size=16384, dtype=np.uint8)
    meta = (3, 12345, 0, 16)
    base = kv_checksum.CHECKSUMS[alg](meta, data)
    words = data.size // 8
    for i, j in [(0, 1), (0, words - 1), (5, 700), (1023, 1024), (17, 1999)]:
        d = data.copy()
        d[i * 8 + 7] ^= 0x80  # bit 63 of little-endian word i
        d[j * 8 + 7] ^= 0x80
        assert kv_checksum.CHECKSUMS[alg](meta, d) != base, (i, j)


def test_checksum_names_are_the_graph_choices():
    from pddflow.core.channel_kinds import CHECKSUM_ALGORITHMS

    assert tuple(kv_checksum.CHECKSUMS) == CHECKSUM_ALGORITHMS
    assert kv_checksum.DEFAULT_CHECKSUM == "xxh3_64"


def test_non_contiguous_tensor_is_refused(kv_factory):
    kv = kv_factory(num_blocks=4, torch_dtype=None)
    kv.data = kv.data[..., ::2]
    with pytest.raises(ChannelError, match="contiguous"):
        codec_kv.KVSource.of(kv)


def test_token_ids_and_control_protobuf_round_trip(no_pickle):
    t = TokenIds("req-000042", 70000, list(range(128000, 128100)), final=True)
    env = token_codec.envelope(t, 7)
    back = pb.Envelope.FromString(env.SerializeToString())
    assert back.msg_no == 7 and token_codec.payload_of(back) == t
    for kind in token_codec.ControlKind:
        c = token_codec.Control(kind, "req-000042", "md lost")
        back = pb.Envelope.FromString(token_codec.envelope(c, 0).SerializeToString())
        assert token_codec.payload_of(back) == c


def test_100_token_handoff_fits_pdd_budget():
    """PDD: a 100-token handoff is about 1.5 KB; ours is far below even with 17-bit token IDs."""
    t = TokenIds("req-0123456789abcdef", 65536, list(range(150000, 150100)))
    assert token_codec.handoff_size(t) <= 1536


def test_generated_proto_imports_with_installed_runtime():
    from google.protobuf import __version__

    assert pb.DESCRIPTOR.package == "pddflow.channels.v1", __version__
    assert {"TokenIds", "Control", "Ack", "Envelope", "KVTransfer", "KVAck", "KVStatus"} <= set(
        pb.DESCRIPTOR.message_types_by_name
    )


def test_no_pickle_in_channel_sources():
    import pathlib

    import pddflow.channels as ch

    root = pathlib.Path(ch.__file__).parent
    offenders = [
        p.name
        for p in root.rglob("*.py")
        if "import pickle" in p.read_text() or "cPickle" in p.read_text()
    ]
    assert offenders == []


def test_empty_kv_set_round_trips():
    data = np.zeros((0, 2, 2, 16, 2, 8), dtype=np.float16)
    kv = KVBlocks("empty", [], 0, 0, 16, data)
    out = kv_landing.decode_ipc(codec_kv.encode_ipc(kv))
    assert out.num_blocks == 0 and out.data.shape == data.shape
