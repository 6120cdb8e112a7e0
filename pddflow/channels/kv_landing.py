"""Receiver-side assembly of a KV set, for every KV receiver: verify, copy into the destination
(the one copy on the receive path), track what landed."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from pddflow.channels.codec_kv import BatchBlocks, schema_meta
from pddflow.channels.errors import ChannelCorrupt, ChannelError
from pddflow.channels.first_token import first_from_meta, first_from_pb
from pddflow.channels.kv_checksum import DEFAULT_CHECKSUM, block_checksum, check_algorithm
from pddflow.channels.kv_layout import (
    KVLayout,
    block_rows,
    hashes_from_bits,
    num_rows,
    token_range,
)
from pddflow.core.payloads import FirstToken, KVBlocks


class KVLanding:
    def __init__(
        self,
        seq_id: str,
        num_blocks: int,
        token_start: int,
        token_end: int,
        block_size: int,
        layout: KVLayout,
        hashes_signed: bool = False,
        dest: Any = None,
        tensor_lib: str | None = None,
        checksum: str = DEFAULT_CHECKSUM,
        heads: tuple[int, int] | None = None,
        first: FirstToken | None = None,
    ):
        self.seq_id, self.num_blocks, self.heads = seq_id, num_blocks, heads
        self.first = first
        self.checksum = check_algorithm(checksum)
        self.token_start, self.token_end, self.block_size = token_start, token_end, block_size
        self.layout, self.hashes_signed = layout, hashes_signed
        self.data = dest if dest is not None else layout.empty(num_blocks, tensor_lib)
        if num_rows(self.data) < num_blocks:
            raise ChannelError(
                f"destination for {seq_id!r} holds {num_rows(self.data)} blocks, need {num_blocks}"
            )
        self.rows = block_rows(self.data)
        if self.rows.shape[1] != layout.block_bytes:
            raise ChannelError(
                f"destination block is {self.rows.shape[1]} bytes, "
                f"the sender's is {layout.block_bytes}"
            )
        self.hashes = np.zeros(num_blocks, dtype=np.uint64)
        self.landed = np.zeros(num_blocks, dtype=bool)
        self._claimed = np.zeros(num_blocks, dtype=bool)
        self.count = 0
        self._lock = threading.Lock()

    @classmethod
    def from_meta(cls, meta: dict, dest: Any = None, tensor_lib: str | None = None) -> KVLanding:
        return cls(
            meta["seq_id"],
            int(meta["num_blocks"]),
            int(meta["token_start"]),
            int(meta["token_end"]),
            int(meta["block_size"]),
            KVLayout.from_dict(meta["layout"]),
            bool(meta.get("hashes_signed")),
            dest,
            tensor_lib,
            str(meta.get("checksum", DEFAULT_CHECKSUM)),
            first=first_from_meta(meta.get("first")),
        )

    @classmethod
    def from_transfer(
        cls, header: Any, layout: KVLayout, dest: Any = None, tensor_lib: str | None = None
    ) -> KVLanding:
        return cls(
            header.seq_id,
            header.num_blocks,
            header.token_start,
            header.token_end,
            header.block_size,
            layout,
            hashes_signed=header.hashes_signed,
            dest=dest,
            tensor_lib=tensor_lib,
            checksum=header.checksum or DEFAULT_CHECKSUM,
            heads=(header.head_start, header.head_end) if header.head_end else None,
            first=first_from_pb(header),
        )

    @property
    def complete(self) -> bool:
        return self.count == self.num_blocks

    def land(self, blocks: BatchBlocks) -> tuple[list[int], list[int]]:
        """Return (accepted, rejected) block indices. A row is verified after its copy, in the
        aligned destination. A block already landed is accepted again (a resend after a lost
        ack); a block another stream is landing now is rejected, to be retried, not trusted."""
        accepted: list[int] = []
        rejected: list[int] = []
        for j in range(len(blocks.index)):
            i = int(blocks.index[j])
            if i >= self.num_blocks:
                raise ChannelError(
                    f"{self.seq_id!r}: block index {i} out of range ({self.num_blocks} blocks)"
                )
            lo, hi = token_range(i, self.token_start, self.token_end, self.block_size)
            if int(blocks.token_start[j]) != lo or int(blocks.token_end[j]) != hi:
                rejected.append(i)  # metadata disagrees with the set
                continue
            with self._lock:
                if self.landed[i]:
                    accepted.append(i)
                    continue
                if self._claimed[i]:
                    rejected.append(i)
                    continue
                self._claimed[i] = True
            ok = False
            try:
                # outside the lock: streams land different blocks in parallel
                self.rows[i] = blocks.rows[j]
                ok = block_checksum(
                    self.checksum, i, int(blocks.hashes[j]), lo, hi, self.rows[i]
                ) == int(blocks.sums[j])
            finally:
                with self._lock:
                    self._claimed[i] = False
                    if ok:
                        self.hashes[i] = blocks.hashes[j]
                        self.landed[i] = True
                        self.count += 1
            (accepted if ok else rejected).append(i)
        return accepted, rejected

    def land_in_place(
        self, indices: Iterable[int], hash_words: np.ndarray, sums: Sequence[int] | None = None
    ) -> tuple[list[int], list[int]]:
        """Blocks a transport already wrote into self.rows; without sums, trust the transport."""
        accepted: list[int] = []
        rejected: list[int] = []
        for i in indices:
            if self.landed[i]:
                accepted.append(i)
                continue
            if sums is not None:
                lo, hi = token_range(i, self.token_start, self.token_end, self.block_size)
                if block_checksum(
                    self.checksum, i, int(hash_words[i]), lo, hi, self.rows[i]
                ) != int(sums[i]):
                    rejected.append(i)
                    continue
            with self._lock:
                if not self.landed[i]:
                    self.hashes[i] = hash_words[i]
                    self.landed[i] = True
                    self.count += 1
            accepted.append(i)
        return accepted, rejected

    def missing(self) -> list[int]:
        return np.flatnonzero(~self.landed).tolist()

    def bitmap(self) -> bytes:
        return np.packbits(self.landed, bitorder="little").tobytes()

    def result(self) -> KVBlocks:
        if not self.complete:
            raise ChannelError(
                f"{self.seq_id!r}: {self.num_blocks - self.count} blocks still missing"
            )
        data = self.data if num_rows(self.data) == self.num_blocks else self.data[: self.num_blocks]
        return KVBlocks(
            self.seq_id,
            hashes_from_bits(self.hashes, self.hashes_signed),
            self.token_start,
            self.token_end,
            self.block_size,
            data,
            self.heads,
            self.first,
        )


def bitmap_indices(bitmap: bytes, num_blocks: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")[:num_blocks]
    return np.flatnonzero(bits)


def decode_kv(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema | None = None,
    *,
    dest: Any = None,
    tensor_lib: str | None = None,
) -> KVBlocks:
    """Assemble from record batches in any order; ChannelCorrupt names blocks that fail."""
    landing: KVLanding | None = None
    bad: list[int] = []
    for batch in batches:
        if landing is None:
            landing = KVLanding.from_meta(schema_meta(schema or batch.schema), dest, tensor_lib)
        _, rejected = landing.land(BatchBlocks.of(batch, landing.layout.block_bytes))
        bad += rejected
    if landing is None:
        if schema is None:
            raise ChannelError("no KV batches to decode")
        landing = KVLanding.from_meta(schema_meta(schema), dest, tensor_lib)
    if bad:
        raise ChannelCorrupt(
            f"{landing.seq_id!r}: checksum mismatch in blocks {sorted(set(bad))}", sorted(set(bad))
        )
    return landing.result()


def decode_ipc(buf: Any, *, dest: Any = None, tensor_lib: str | None = None) -> KVBlocks:
    reader = pa.ipc.open_stream(buf)
    return decode_kv(reader, reader.schema, dest=dest, tensor_lib=tensor_lib)
