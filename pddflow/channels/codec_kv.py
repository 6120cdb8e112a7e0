"""`KVBlocks` <-> Arrow record batches, one row per block: the one wire form of KV, zero-copy both
ways (docs/channels.md, Wire formats has the columns)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pddflow.channels.errors import ChannelCorrupt, ChannelError
from pddflow.channels.first_token import first_from_meta, first_to_meta
from pddflow.channels.kv_checksum import DEFAULT_CHECKSUM, block_checksum, check_algorithm
from pddflow.channels.kv_layout import (
    KVLayout,
    block_rows,
    hash_bits,
    hashes_from_bits,
    num_rows,
    token_range,
)
from pddflow.core.payloads import KVBlocks

SCHEMA_KEY = b"pddflow.kv"
WIRE_VERSION = 1
COLUMNS = ["block_index", "block_hash", "token_start", "token_end", "checksum", "kv"]

_SUMS_INIT = threading.Lock()  # held only while a KVSource creates its checksum arrays


def kv_schema(block_bytes: int, meta: dict) -> pa.Schema:
    return pa.schema(
        [
            pa.field("block_index", pa.uint32(), nullable=False),
            pa.field("block_hash", pa.uint64(), nullable=False),
            pa.field("token_start", pa.int64(), nullable=False),
            pa.field("token_end", pa.int64(), nullable=False),
            pa.field("checksum", pa.uint64(), nullable=False),
            pa.field("kv", pa.binary(block_bytes), nullable=False),
        ],
        metadata={SCHEMA_KEY: json.dumps(meta, separators=(",", ":")).encode()},
    )


def schema_meta(schema: pa.Schema) -> dict:
    raw = (schema.metadata or {}).get(SCHEMA_KEY)
    if raw is None:
        raise ChannelError("not a pddflow KV stream: schema metadata 'pddflow.kv' missing")
    meta = json.loads(raw)
    if meta.get("version") != WIRE_VERSION:
        raise ChannelError(
            f"KV wire version {meta.get('version')} is not supported "
            f"(this build speaks {WIRE_VERSION})"
        )
    return meta


@dataclass
class KVSource:
    """A KVBlocks prepared for sending, shared by both paths of a dual-path send so checksums
    (lazy) are computed once."""

    kv: KVBlocks
    layout: KVLayout
    rows: np.ndarray
    hashes: np.ndarray
    hashes_signed: bool
    checksum: str = DEFAULT_CHECKSUM
    _sums: np.ndarray | None = None
    _have: np.ndarray | None = None

    @classmethod
    def of(cls, kv: KVBlocks, checksum: str = DEFAULT_CHECKSUM) -> KVSource:
        if kv.num_blocks != num_rows(kv.data):
            raise ChannelError(
                f"KVBlocks {kv.seq_id!r}: {kv.num_blocks} block hashes but data has "
                f"{num_rows(kv.data)} blocks"
            )
        expect = -(-(kv.token_end - kv.token_start) // kv.block_size) if kv.block_size > 0 else -1
        if kv.num_blocks and expect != kv.num_blocks:
            raise ChannelError(
                f"KVBlocks {kv.seq_id!r}: tokens [{kv.token_start}, {kv.token_end}) at block_size "
                f"{kv.block_size} make {expect} blocks, not {kv.num_blocks}"
            )
        layout = KVLayout.of(kv.data)
        rows = block_rows(kv.data)
        bits, signed = hash_bits(kv.block_hashes)
        return cls(kv, layout, rows, bits, signed, check_algorithm(checksum))

    def sum(self, i: int) -> int:
        """Thread-safe: the arrays are created once under a lock (else one thread's `have` flag
        could pair with another's sums and send a zero checksum, rejected on every resend)."""
        if self._have is None:
            with _SUMS_INIT:
                if self._have is None:
                    self._sums = np.zeros(self.kv.num_blocks, dtype=np.uint64)
                    # last: readers take a non-None _have to mean _sums exists too
                    self._have = np.zeros(self.kv.num_blocks, dtype=bool)
        if not self._have[i]:  # type: ignore[index]
            lo, hi = token_range(i, self.kv.token_start, self.kv.token_end, self.kv.block_size)
            self._sums[i] = block_checksum(
                self.checksum, i, int(self.hashes[i]), lo, hi, self.rows[i]
            )
            self._have[i] = True  # type: ignore[index]
        return int(self._sums[i])

    def sums(self, indices: Iterable[int]) -> list[int]:
        return [self.sum(i) for i in indices]

    def meta(self) -> dict:
        kv = self.kv
        return {
            "version": WIRE_VERSION,
            "seq_id": kv.seq_id,
            "num_blocks": kv.num_blocks,
            "token_start": kv.token_start,
            "token_end": kv.token_end,
            "block_size": kv.block_size,
            "hashes_signed": self.hashes_signed,
            "checksum": self.checksum,
            "layout": self.layout.to_dict(),
            **({"first": first_to_meta(kv.first)} if kv.first is not None else {}),
        }

    def schema(self) -> pa.Schema:
        return kv_schema(self.layout.block_bytes, self.meta())

    def batches(
        self, blocks: Iterable[int] | None = None, max_batch_bytes: int = 8 << 20
    ) -> Iterator[pa.RecordBatch]:
        """Runs of consecutive blocks, at most max_batch_bytes (at least one block) each."""
        idx = (
            list(range(self.kv.num_blocks))
            if blocks is None
            else sorted(set(int(b) for b in blocks))
        )
        per_batch = max(1, max_batch_bytes // max(1, self.layout.block_bytes))
        schema = self.schema()
        for run in _runs(idx, per_batch):
            yield self.batch(run[0], run[-1] + 1, schema)

    def batch(self, lo: int, hi: int, schema: pa.Schema | None = None) -> pa.RecordBatch:
        kv, block_bytes = self.kv, self.layout.block_bytes
        n = hi - lo
        starts = np.array(
            [token_range(i, kv.token_start, kv.token_end, kv.block_size)[0] for i in range(lo, hi)],
            dtype=np.int64,
        )
        ends = np.minimum(starts + kv.block_size, kv.token_end).astype(np.int64)
        kv_buf = pa.py_buffer(self.rows[lo:hi].reshape(-1)) if n else pa.py_buffer(b"")
        cols = [
            pa.array(np.arange(lo, hi, dtype=np.uint32)),
            pa.array(self.hashes[lo:hi]),
            pa.array(starts),
            pa.array(ends),
            pa.array(np.array(self.sums(range(lo, hi)), dtype=np.uint64)),
            pa.Array.from_buffers(pa.binary(block_bytes), n, [None, kv_buf]),
        ]
        return pa.RecordBatch.from_arrays(cols, schema=schema or self.schema())


@dataclass
class BatchBlocks:
    """One received record batch's columns, as zero-copy numpy views."""

    index: np.ndarray
    hashes: np.ndarray  # uint64 [n]
    token_start: np.ndarray
    token_end: np.ndarray
    sums: np.ndarray  # uint64 [n]
    rows: np.ndarray  # uint8 [n, block_bytes]

    @classmethod
    def of(cls, batch: pa.RecordBatch, block_bytes: int) -> BatchBlocks:
        if batch.schema.names != COLUMNS:
            raise ChannelError(f"unexpected KV batch columns {batch.schema.names}")
        kv = batch.column(5)
        if kv.type != pa.binary(block_bytes):
            raise ChannelError(
                f"KV batch kv column is {kv.type}, expected fixed_size_binary[{block_bytes}]"
            )
        n = batch.num_rows
        if kv.null_count:
            raise ChannelError("KV batch has null blocks")
        buf = kv.buffers()[1]
        rows = np.frombuffer(
            buf, dtype=np.uint8, count=n * block_bytes, offset=kv.offset * block_bytes
        )
        cols = [batch.column(i).to_numpy(zero_copy_only=True) for i in range(5)]
        return cls(cols[0], cols[1], cols[2], cols[3], cols[4], rows.reshape(n, block_bytes))

    def verify(self, algorithm: str) -> np.ndarray:
        ok = np.empty(len(self.index), dtype=bool)
        for j in range(len(self.index)):
            ok[j] = block_checksum(
                algorithm,
                int(self.index[j]),
                int(self.hashes[j]),
                int(self.token_start[j]),
                int(self.token_end[j]),
                self.rows[j],
            ) == int(self.sums[j])
        return ok


def view_batch(batch: pa.RecordBatch, tensor_lib: str | None = None) -> KVBlocks:
    """Zero-copy, read-only KVBlocks over one verified batch; ChannelCorrupt if a checksum fails."""
    meta = schema_meta(batch.schema)
    layout = KVLayout.from_dict(meta["layout"])
    blocks = BatchBlocks.of(batch, layout.block_bytes)
    ok = blocks.verify(str(meta.get("checksum", DEFAULT_CHECKSUM)))
    if not ok.all():
        bad = blocks.index[~ok].tolist()
        raise ChannelCorrupt(f"{meta['seq_id']!r}: checksum mismatch in blocks {bad}", bad)
    idx = blocks.index.astype(np.int64)
    if len(idx) and not np.array_equal(idx, np.arange(idx[0], idx[0] + len(idx))):
        raise ChannelError("view_batch needs consecutive blocks")
    start = int(blocks.token_start[0]) if len(idx) else int(meta["token_start"])
    end = int(blocks.token_end[-1]) if len(idx) else start
    return KVBlocks(
        meta["seq_id"],
        hashes_from_bits(blocks.hashes, bool(meta.get("hashes_signed"))),
        start,
        end,
        int(meta["block_size"]),
        layout.view(blocks.rows, tensor_lib),
        first=first_from_meta(meta.get("first")),
    )


def encode_ipc(
    kv: KVBlocks, max_batch_bytes: int = 8 << 20, checksum: str = DEFAULT_CHECKSUM
) -> pa.Buffer:
    src = KVSource.of(kv, checksum)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, src.schema()) as writer:
        for batch in src.batches(max_batch_bytes=max_batch_bytes):
            writer.write_batch(batch)
    return sink.getvalue()


def _runs(idx: list[int], per_batch: int) -> Iterator[list[int]]:
    run: list[int] = []
    for i in idx:
        if run and (i != run[-1] + 1 or len(run) >= per_batch):
            yield run
            run = []
        run.append(i)
    if run:
        yield run
