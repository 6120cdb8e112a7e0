"""`KVBlocks` <-> Arrow record batches: the one wire form of KV in pddflow.

One row per block. Columns:

    block_index  uint32          position of the block inside the KVBlocks set (0..num_blocks-1)
    block_hash   uint64          the radix-cache key of the block (int64 bits when the schema says so)
    token_start  int64           first token position the block covers
    token_end    int64           one past its last (a final partial block ends early)
    checksum     uint64          over the row's metadata and its K/V bytes (algorithm in the metadata)
    kv           fixed_size_binary[block_bytes]
                                 data[i] as raw bytes: [num_layers, 2 (K, V), block_size, heads, head_dim]

The schema metadata key `pddflow.kv` holds JSON describing the set (sequence, token range, layout,
checksum algorithm), so an IPC stream or file is self-describing. No pickle anywhere.

Checksums (per block; the metadata words index, hash, token_start, token_end come first):
    xsum64  sum of w_k * word_k mod 2^64 over the little-endian 64-bit words, w_k = 2k + 1. Odd
            weights make every error inside one word, and every burst of up to 64 bits, change
            the sum; a random error goes unnoticed with probability 2^-64. numpy computes it at
            memory speed (about 3x zlib's CRC-32 here), so it is the default.
    crc32   zlib CRC-32: the classic, slower; bursts up to 32 bits always caught, random errors
            missed with probability 2^-32.

Zero copy: encoding wraps the tensor's memory in Arrow buffers (a contiguous run of blocks becomes
one `kv` buffer, nothing is copied); decoding a batch gives numpy/torch views of the Arrow buffer.
The one copy a receiver makes is landing blocks into its destination tensor (its KV cache), done by
`KVLanding`, which verifies each block's checksum first: a corrupt block is rejected (and, on a
channel, re-requested), never decoded.
"""

from __future__ import annotations

import json
import struct
import threading
import warnings
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from pddflow.channels.errors import ChannelCorrupt, ChannelError
from pddflow.core.payloads import KVBlocks

SCHEMA_KEY = b"pddflow.kv"
WIRE_VERSION = 1
_U64 = (1 << 64) - 1
_ROW_META = struct.Struct("<QQQQ")  # block_index, block_hash bits, token_start, token_end


# --------------------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class KVLayout:
    """How one block of a KVBlocks tensor is laid out in memory."""

    tensor_lib: str  # "torch" or "numpy"
    dtype: str  # torch dtype name ("bfloat16") or numpy dtype name ("float16")
    block_shape: tuple[int, ...]  # [num_layers, 2, block_size, num_kv_heads, head_dim]
    itemsize: int

    @property
    def block_bytes(self) -> int:
        return int(np.prod(self.block_shape, dtype=np.int64)) * self.itemsize

    @classmethod
    def of(cls, data: Any) -> KVLayout:
        if _is_torch(data):
            import torch  # noqa: F401  (only reached with a torch tensor in hand)

            return cls(
                "torch",
                str(data.dtype).removeprefix("torch."),
                tuple(int(s) for s in data.shape[1:]),
                int(data.element_size()),
            )
        arr = np.asarray(data)
        return cls(
            "numpy", arr.dtype.name, tuple(int(s) for s in arr.shape[1:]), int(arr.dtype.itemsize)
        )

    def to_dict(self) -> dict:
        return {
            "tensor_lib": self.tensor_lib,
            "dtype": self.dtype,
            "block_shape": list(self.block_shape),
            "itemsize": self.itemsize,
        }

    @classmethod
    def from_dict(cls, d: dict) -> KVLayout:
        return cls(
            str(d["tensor_lib"]),
            str(d["dtype"]),
            tuple(int(x) for x in d["block_shape"]),
            int(d["itemsize"]),
        )

    def to_proto(self, pb: Any) -> Any:
        return pb.KVLayout(
            tensor_lib=self.tensor_lib,
            dtype=self.dtype,
            block_shape=list(self.block_shape),
            block_bytes=self.block_bytes,
        )

    @classmethod
    def from_proto(cls, msg: Any) -> KVLayout:
        shape = tuple(int(x) for x in msg.block_shape)
        elems = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if elems <= 0 or msg.block_bytes % elems:
            raise ChannelError(f"KV layout {shape} does not divide block_bytes={msg.block_bytes}")
        return cls(msg.tensor_lib, msg.dtype, shape, int(msg.block_bytes // elems))

    def empty(self, num_blocks: int, tensor_lib: str | None = None) -> Any:
        """A new destination tensor for num_blocks blocks."""
        lib = tensor_lib or self.tensor_lib
        if lib == "torch":
            import torch

            return torch.empty((num_blocks, *self.block_shape), dtype=_torch_dtype(self.dtype))
        return np.empty((num_blocks, *self.block_shape), dtype=_numpy_dtype(self.dtype))

    def view(self, rows: np.ndarray, tensor_lib: str | None = None) -> Any:
        """A zero-copy tensor over a uint8 array of shape [n, block_bytes]."""
        n = rows.shape[0]
        lib = tensor_lib or self.tensor_lib
        if lib == "torch":
            import torch

            with (
                warnings.catch_warnings()
            ):  # Arrow buffers are read-only; torch warns, the view is fine
                warnings.simplefilter("ignore", UserWarning)
                t = torch.from_numpy(rows)
            return t.view(_torch_dtype(self.dtype)).reshape(n, *self.block_shape)
        return rows.view(_numpy_dtype(self.dtype)).reshape(n, *self.block_shape)


def _is_torch(data: Any) -> bool:
    return type(data).__module__.startswith("torch") and hasattr(data, "element_size")


def _torch_dtype(name: str) -> Any:
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ChannelError(f"unknown torch dtype {name!r} in KV layout")
    return dt


def _numpy_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError as exc:
        raise ChannelError(
            f"dtype {name!r} has no numpy equivalent; send it as a torch tensor"
        ) from exc


def block_rows(data: Any) -> np.ndarray:
    """data as a uint8 array of shape [num_blocks, block_bytes] sharing its memory (no copy).

    A torch tensor on an accelerator is staged to host memory first (one copy); a non-contiguous
    tensor is refused, because a silent copy of a multi-GB KV set is a bug worth hearing about."""
    if _is_torch(data):
        t = data.detach()
        if t.device.type != "cpu":
            t = t.contiguous().cpu()
        if not t.is_contiguous():
            raise ChannelError(
                "KVBlocks.data must be contiguous (call .contiguous() on the producer side)"
            )
        import torch

        n = t.shape[0]
        per = int(np.prod(t.shape[1:], dtype=np.int64)) * t.element_size()
        return t.reshape(-1).view(torch.uint8).numpy().reshape(n, per)
    arr = np.asarray(data)
    if not arr.flags.c_contiguous:
        raise ChannelError(
            "KVBlocks.data must be C-contiguous (np.ascontiguousarray on the producer side)"
        )
    n = arr.shape[0]
    per = int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.dtype.itemsize
    return arr.reshape(-1).view(np.uint8).reshape(n, per)


# ------------------------------------------------------------------------------------ checksums


def hash_bits(hashes: Sequence[int]) -> tuple[np.ndarray, bool]:
    """Block hashes as uint64 bits, and whether they must be read back as signed int64."""
    signed = any(h < 0 for h in hashes)
    for h in hashes:
        if not (-(1 << 63) <= h <= _U64) or (signed and h > (1 << 63) - 1):
            raise ChannelError(
                f"block hash {h} does not fit 64 bits (signed and unsigned hashes mixed?)"
            )
    return np.array([h & _U64 for h in hashes], dtype=np.uint64), signed


def hashes_from_bits(bits: np.ndarray, signed: bool) -> list[int]:
    return (
        bits.astype(np.uint64).view(np.int64).tolist()
        if signed
        else bits.astype(np.uint64).tolist()
    )


def _crc32(meta: tuple[int, int, int, int], kv: Any) -> int:
    return zlib.crc32(kv, zlib.crc32(_ROW_META.pack(*meta)))  # zlib drops the GIL on large buffers


_WEIGHTS: dict[int, np.ndarray] = {}


def _weights(n: int) -> np.ndarray:
    w = _WEIGHTS.get(n)
    if w is None:
        if len(_WEIGHTS) > 8:
            _WEIGHTS.clear()
        w = _WEIGHTS[n] = np.arange(1, 2 * n, 2, dtype=np.uint64)
    return w


def _xsum64(meta: tuple[int, int, int, int], kv: Any) -> int:
    b = kv if isinstance(kv, np.ndarray) else np.frombuffer(kv, dtype=np.uint8)
    b = b.reshape(-1)
    n8 = b.shape[0] // 8
    tail = b[n8 * 8 :]
    w = _weights(4 + n8 + (1 if tail.shape[0] else 0))
    total = int(np.dot(b[: n8 * 8].view(np.uint64), w[4 : 4 + n8])) if n8 else 0
    for k, m in enumerate(meta):
        total += (m & _U64) * int(w[k])
    if tail.shape[0]:
        total += int.from_bytes(tail.tobytes().ljust(8, b"\0"), "little") * int(w[-1])
    return total & _U64


CHECKSUMS = {"xsum64": _xsum64, "crc32": _crc32}
DEFAULT_CHECKSUM = "xsum64"


def check_algorithm(name: str) -> str:
    if name not in CHECKSUMS:
        raise ChannelError(f"unknown checksum {name!r}; valid: {', '.join(sorted(CHECKSUMS))}")
    return name


def block_checksum(
    alg: str, index: int, hash_bits_: int, token_start: int, token_end: int, kv: Any
) -> int:
    """Checksum of one block's row: its metadata, then its K/V bytes."""
    return CHECKSUMS[alg]((index, hash_bits_, token_start & _U64, token_end & _U64), kv)


def token_range(i: int, token_start: int, token_end: int, block_size: int) -> tuple[int, int]:
    lo = token_start + i * block_size
    return lo, min(token_end, lo + block_size)


# ------------------------------------------------------------------------------------- encoding

_SUMS_INIT = threading.Lock()  # creating a KVSource's checksum arrays (once per source, brief)


@dataclass
class KVSource:
    """A KVBlocks prepared for sending: byte rows (zero-copy), hash bits and lazily computed
    checksums. Both paths of PDD's dual-path send can share one KVSource so checksums are
    computed once."""

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
        if kv.num_blocks != _num_rows(kv.data):
            raise ChannelError(
                f"KVBlocks {kv.seq_id!r}: {kv.num_blocks} block hashes but data has "
                f"{_num_rows(kv.data)} blocks"
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
        """Block i's checksum (computed once). Stream threads call this concurrently: the arrays
        are created once under a lock (two threads creating them could pair one thread's sum
        with the other's `have` flag and send a zero checksum, rejected on every resend)."""
        if self._have is None:
            with _SUMS_INIT:
                if self._have is None:
                    self._sums = np.zeros(self.kv.num_blocks, dtype=np.uint64)
                    self._have = np.zeros(
                        self.kv.num_blocks, dtype=bool
                    )  # last: the readers' signal
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
        }

    def schema(self) -> pa.Schema:
        return kv_schema(self.layout.block_bytes, self.meta())

    def batches(
        self, blocks: Iterable[int] | None = None, max_batch_bytes: int = 8 << 20
    ) -> Iterator[pa.RecordBatch]:
        """Record batches over `blocks` (default: all), each a run of consecutive blocks of at most
        max_batch_bytes (at least one block); the kv column points into the tensor's memory."""
        idx = (
            list(range(self.kv.num_blocks))
            if blocks is None
            else sorted(set(int(b) for b in blocks))
        )
        per = max(1, max_batch_bytes // max(1, self.layout.block_bytes))
        schema = self.schema()
        for run in _runs(idx, per):
            yield self.batch(run[0], run[-1] + 1, schema)

    def batch(self, lo: int, hi: int, schema: pa.Schema | None = None) -> pa.RecordBatch:
        kv, bb = self.kv, self.layout.block_bytes
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
            pa.Array.from_buffers(pa.binary(bb), n, [None, kv_buf]),
        ]
        return pa.RecordBatch.from_arrays(cols, schema=schema or self.schema())


def _num_rows(data: Any) -> int:
    return int(data.shape[0])


def _runs(idx: list[int], per: int) -> Iterator[list[int]]:
    run: list[int] = []
    for i in idx:
        if run and (i != run[-1] + 1 or len(run) >= per):
            yield run
            run = []
        run.append(i)
    if run:
        yield run


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
            f"KV wire version {meta.get('version')} is not supported (this build speaks {WIRE_VERSION})"
        )
    return meta


# ------------------------------------------------------------------------------------- decoding


@dataclass
class BatchBlocks:
    """The columns of one received record batch, as zero-copy numpy views."""

    index: np.ndarray  # uint32 [n]
    hashes: np.ndarray  # uint64 [n]
    token_start: np.ndarray
    token_end: np.ndarray
    sums: np.ndarray  # uint64 [n]
    rows: np.ndarray  # uint8 [n, block_bytes]

    @classmethod
    def of(cls, batch: pa.RecordBatch, block_bytes: int) -> BatchBlocks:
        if batch.schema.names != [
            "block_index",
            "block_hash",
            "token_start",
            "token_end",
            "checksum",
            "kv",
        ]:
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

    def verify(self, alg: str) -> np.ndarray:
        """Boolean mask: True where the row's checksum matches."""
        ok = np.empty(len(self.index), dtype=bool)
        for j in range(len(self.index)):
            ok[j] = block_checksum(
                alg,
                int(self.index[j]),
                int(self.hashes[j]),
                int(self.token_start[j]),
                int(self.token_end[j]),
                self.rows[j],
            ) == int(self.sums[j])
        return ok


class KVLanding:
    """Receiver-side assembly of one KVBlocks set: verifies each block, copies good blocks into the
    destination tensor (the single copy on the receive path), tracks which blocks have landed."""

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
    ):
        self.seq_id, self.num_blocks = seq_id, num_blocks
        self.checksum = check_algorithm(checksum)
        self.token_start, self.token_end, self.block_size = token_start, token_end, block_size
        self.layout, self.hashes_signed = layout, hashes_signed
        self.data = dest if dest is not None else layout.empty(num_blocks, tensor_lib)
        if _num_rows(self.data) < num_blocks:
            raise ChannelError(
                f"destination for {seq_id!r} holds {_num_rows(self.data)} blocks, need {num_blocks}"
            )
        self.rows = block_rows(self.data)
        if self.rows.shape[1] != layout.block_bytes:
            raise ChannelError(
                f"destination block is {self.rows.shape[1]} bytes, the sender's is {layout.block_bytes}"
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
        )

    @property
    def complete(self) -> bool:
        return self.count == self.num_blocks

    def land(self, blocks: BatchBlocks) -> tuple[list[int], list[int]]:
        """Land the good rows; return (accepted, rejected) block indices.

        Each row is copied into its destination row first and verified there: the destination
        is aligned (received Arrow buffers often are not, which slows the checksum) and the copy
        is needed anyway. A row that fails stays un-landed and is reported rejected, so it is
        resent and never handed out. A block already landed is accepted again without a copy (a
        resend after a lost ack); one being landed by another stream right now is reported
        rejected, so the sender retries it rather than trusting a copy nobody verified yet."""
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
                rejected.append(i)  # metadata disagrees with the set: treat as corrupt
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
                self.rows[i] = blocks.rows[
                    j
                ]  # outside the lock: streams land different blocks in parallel
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
        self, indices: Iterable[int], hash_bits_: np.ndarray, sums: Sequence[int] | None = None
    ) -> tuple[list[int], list[int]]:
        """Blocks whose bytes a transport already wrote into self.rows (the shared-memory path).
        With sums, verify each against the set's metadata first; without, trust the transport."""
        accepted: list[int] = []
        rejected: list[int] = []
        for i in indices:
            if self.landed[i]:
                accepted.append(i)
                continue
            if sums is not None:
                lo, hi = token_range(i, self.token_start, self.token_end, self.block_size)
                if block_checksum(
                    self.checksum, i, int(hash_bits_[i]), lo, hi, self.rows[i]
                ) != int(sums[i]):
                    rejected.append(i)
                    continue
            with self._lock:
                if not self.landed[i]:
                    self.hashes[i] = hash_bits_[i]
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
        data = (
            self.data if _num_rows(self.data) == self.num_blocks else self.data[: self.num_blocks]
        )
        return KVBlocks(
            self.seq_id,
            hashes_from_bits(self.hashes, self.hashes_signed),
            self.token_start,
            self.token_end,
            self.block_size,
            data,
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
    """Assemble a KVBlocks from record batches (any order). Raises ChannelCorrupt naming the bad
    blocks if any checksum fails, ChannelError if blocks are missing."""
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


def encode_ipc(
    kv: KVBlocks, max_batch_bytes: int = 8 << 20, checksum: str = DEFAULT_CHECKSUM
) -> pa.Buffer:
    """KVBlocks as one Arrow IPC stream (the file/socket form of the same batches Flight sends)."""
    src = KVSource.of(kv, checksum)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, src.schema()) as writer:
        for batch in src.batches(max_batch_bytes=max_batch_bytes):
            writer.write_batch(batch)
    return sink.getvalue()


def decode_ipc(buf: Any, *, dest: Any = None, tensor_lib: str | None = None) -> KVBlocks:
    reader = pa.ipc.open_stream(buf)
    return decode_kv(reader, reader.schema, dest=dest, tensor_lib=tensor_lib)


def view_batch(batch: pa.RecordBatch, tensor_lib: str | None = None) -> KVBlocks:
    """Zero-copy KVBlocks over one verified batch of consecutive blocks (data is read-only memory
    owned by the batch). Raises ChannelCorrupt if any checksum fails."""
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
    )
