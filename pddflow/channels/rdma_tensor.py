"""rdma_tensor: KVBlocks between processes inside a cluster (Prefill -> RelayDecode).

Tensor bytes are never serialised. The receiver owns shared memory that the sender writes into,
in one of two ways per KV set:

  direct   The receiver keeps a landing arena (`arena_mb`, shared with every sender). For each
           set it reserves a region there; the sender copies the blocks straight into it, as an
           RDMA write lands in registered memory, and the receiver hands that region out as the
           KVBlocks' tensor: one copy end to end. The region returns to the arena when the worker
           drops the tensor (and every view of it).
  ring     When the arena is off, full, or the worker supplies its own destination (`alloc`),
           the sender copies runs of blocks into a ring of `ring_slots` x `slot_mb` slots and
           the receiver copies each slot into the destination and hands the slot back. The two
           copies overlap in the two processes.

Control frames (Unix socket on one host, TCP for NIXL across hosts; `struct`/protobuf, no pickle):

    HELLO  s->r  protocol version           RING   r->s  transport, ring and arena (+ memfds)
    BEGIN  s->r  KVTransfer (layout, hashes, token range, optional per-block checksums)
    PLACE  r->s  arena offset, or "use the ring"
    CHUNK  s->r  slot, byte offset, length  FREE   r->s  slot          (ring mode only)
    END    s->r  pass done                  RESULT r->s  KVAck: rejected blocks, complete
    CANCEL s->r  KVCancel                   ERROR  r->s  text (e.g. the sequence was cancelled)

With `checksum="xsum64"` (or "crc32") the receiver verifies every block after a pass and the
sender resends the rejected ones (at most max_block_retries times). It is off by default: a copy
between two processes on one host has no wire to corrupt it, and a checksum pass on each side
costs more than the copy. Every wait has a deadline; a receiver that stops answering makes `send`
raise ChannelTimeout at the deadline.
"""

from __future__ import annotations

import ctypes
import os
import select
import socket
import struct
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from pddflow.channels.codec_kv import KVLanding, KVLayout, KVSource, check_algorithm
from pddflow.channels.deadline import Deadline
from pddflow.channels.errors import (
    ChannelCancelled,
    ChannelClosed,
    ChannelCorrupt,
    ChannelError,
    ChannelTimeout,
)
from pddflow.channels.inbox import Inbox
from pddflow.channels.proto import pddflow_pb2 as pb
from pddflow.channels.rdma_transport import (
    Frames,
    Region,
    RegionWriter,
    Transport,
    format_address,
    parse_address,
    pick_transport,
    transports,
)
from pddflow.channels.transfer import TransferReport
from pddflow.core.payloads import KVBlocks

HELLO, RING, BEGIN, CHUNK, END, FREE, RESULT, CANCEL, ERROR, PLACE = range(1, 11)
VERSION = 2
NO_PLACE = (1 << 64) - 1
_CHUNK = struct.Struct("<IQQ")
_FREE = struct.Struct("<I")
_PLACE = struct.Struct("<Q")
_RING = struct.Struct(
    "<IIQBBB"
)  # slots, slot_bytes, arena_bytes, ring fds, arena fds, len(transport name)
_DIRECT_PIECE = 8 << 20  # direct writes go in pieces: deadline and cancel checks between them

Alloc = Callable[[str, int, KVLayout], Any]


@dataclass(frozen=True)
class RdmaTensorParams:
    """Channel params a graph edge passes (`channel: rdma_tensor`)."""

    # 4 x 2 MiB: the ring stays in cache between the two copies (measured best here)
    ring_slots: int = 4
    slot_mb: float = 2.0
    # direct-landing arena per receiver (pages are committed on first use); 0: ring only
    arena_mb: float = 512.0
    deadline_s: float = 10.0
    # sender side: None, "xsum64" or "crc32"; the receiver verifies and NACKs
    checksum: str | None = None
    transport: str = "auto"  # auto | shm | nixl
    max_block_retries: int = 3

    def __post_init__(self) -> None:
        if self.checksum is True or self.checksum is False:  # tolerate a YAML boolean
            object.__setattr__(self, "checksum", "xsum64" if self.checksum else None)
        if self.checksum is not None:
            check_algorithm(self.checksum)
        if self.ring_slots < 1:
            raise ValueError("rdma_tensor ring_slots must be >= 1")

    @property
    def slot_bytes(self) -> int:
        return max(4096, int(self.slot_mb * (1 << 20)))

    @property
    def arena_bytes(self) -> int:
        return max(0, int(self.arena_mb * (1 << 20))) // 4096 * 4096


# ================================================================================ receiver


class _Arena:
    """First-fit allocator over the landing region. A region is handed out as an array whose
    memory is owned by a ctypes holder (numpy collapses view chains to the owner, so every view
    and tensor made from it keeps the holder alive); when the last one is gone the holder is
    collected and weakref.finalize returns the region: a dropped KVBlocks frees its arena space."""

    ALIGN = 4096

    def __init__(self, region: Region):
        self.region = region
        self._free: list[tuple[int, int]] = [(0, region.nbytes)]
        self._lock = threading.Lock()

    def take(self, n: int) -> tuple[int, np.ndarray] | None:
        size = -(-max(n, 1) // self.ALIGN) * self.ALIGN
        with self._lock:
            for k, (off, length) in enumerate(self._free):
                if length >= size:
                    self._free[k : k + 1] = [(off + size, length - size)] if length > size else []
                    break
            else:
                return None
        holder = (ctypes.c_uint8 * n).from_buffer(self.region.buffer(), off)
        weakref.finalize(holder, self._give_back, off, size)
        return off, np.frombuffer(holder, dtype=np.uint8)

    def _give_back(self, off: int, size: int) -> None:
        with self._lock:
            self._free.append((off, size))
            self._free.sort()
            merged: list[tuple[int, int]] = []
            for o, s in self._free:
                if merged and merged[-1][0] + merged[-1][1] == o:
                    merged[-1] = (merged[-1][0], merged[-1][1] + s)
                else:
                    merged.append((o, s))
            self._free = merged

    def free_bytes(self) -> int:
        with self._lock:
            return sum(s for _, s in self._free)


class _Conn:
    def __init__(self, frames: Frames, ring: Region, slot_bytes: int):
        self.frames, self.ring, self.slot_bytes = frames, ring, slot_bytes
        self.landing: KVLanding | None = None
        self.hdr: Any = None
        self.hash_bits: np.ndarray | None = None
        self.flat: np.ndarray | None = None
        self.dl: Deadline | None = None
        self.hold: np.ndarray | None = None  # the arena region the sender may still be writing into

    def reset(self) -> None:
        """Forget the current set. Only ever called once the sender has stopped writing into its
        arena region (END, CANCEL, or the connection's end), so the region cannot be reused
        under a writer even when cancel() dropped the landing earlier."""
        self.landing = self.flat = self.hdr = self.dl = self.hash_bits = self.hold = None


class RdmaTensorReceiver:
    """Listens on `address` (default: a fresh abstract Unix socket name); each sender connection
    gets its own ring, all share the landing arena. `recv(seq_id=None, timeout_s=...)` returns
    completed KVBlocks; with `alloc(seq_id, num_blocks, layout)` the worker chooses every
    destination itself (ring mode)."""

    def __init__(
        self,
        address: str | None = None,
        *,
        params: RdmaTensorParams = RdmaTensorParams(),
        alloc: Alloc | None = None,
        tensor_lib: str | None = None,
    ):
        self.params = params
        self._transport = pick_transport(params.transport)
        address = address or f"unix:@pddflow-rdma-{os.getpid()}-{uuid.uuid4().hex[:10]}"
        family, sockaddr = parse_address(address)
        if self._transport.needs_unix_socket and family != socket.AF_UNIX:
            raise ChannelError(
                f"rdma_tensor transport {self._transport.name!r} works between processes on one "
                f"host: use a unix: address, not {address!r}"
            )
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        if family != socket.AF_UNIX:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(sockaddr)
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.address = format_address(family, self._sock.getsockname())
        self._alloc, self._tensor_lib = alloc, tensor_lib
        self._arena = (
            _Arena(self._transport.create_region(params.arena_bytes, populate=False))
            if params.arena_bytes and alloc is None
            else None
        )
        self._inbox = Inbox("rdma_tensor")
        self._closed = threading.Event()
        self._conns: list[_Conn] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept_loop, daemon=True, name="rdma_tensor-accept")
        t.start()
        self._threads.append(t)

    def recv(
        self,
        seq_id: str | None = None,
        timeout_s: float | None = None,
        deadline: float | None = None,
    ) -> KVBlocks:
        dl = Deadline.of(
            timeout_s if timeout_s is not None or deadline is not None else self.params.deadline_s,
            deadline,
            what=f"rdma_tensor recv{'(' + seq_id + ')' if seq_id else ''}",
        )
        return self._inbox.get(seq_id, dl)

    def cancel(self, seq_id: str, reason: str = "cancelled by receiver") -> None:
        """Drop seq_id's partial or unconsumed KV (its arena region returns) and refuse further
        blocks for it."""
        self._inbox.cancel(seq_id, reason)
        with self._lock:
            for c in self._conns:
                if c.hdr is not None and c.hdr.seq_id == seq_id:
                    c.landing = c.flat = None  # the serving thread notices at the next frame

    def arena_free_bytes(self) -> int:
        return self._arena.free_bytes() if self._arena is not None else 0

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._sock.close()
        self._inbox.close()
        for t in self._threads:
            t.join(timeout=5)
        if self._arena is not None:
            self._arena.region.close()

    def __enter__(self) -> RdmaTensorReceiver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(
                target=self._serve, args=(sock,), daemon=True, name="rdma_tensor-conn"
            )
            t.start()
            self._threads.append(t)

    def _serve(self, sock: socket.socket) -> None:
        frames = Frames(sock)
        ring: Region | None = None
        conn: _Conn | None = None
        try:
            kind, body, fds = frames.recv(
                Deadline.of(10.0, what="rdma_tensor handshake"), "waiting for HELLO"
            )
            _close_fds(fds)
            if kind != HELLO or pb.Hello.FromString(body).version != VERSION:
                frames.send(ERROR, b"rdma_tensor: bad handshake (protocol version mismatch?)")
                return
            p = self.params
            ring = self._transport.create_region(p.ring_slots * p.slot_bytes, populate=True)
            ring_payload, ring_fds = ring.descriptor()
            arena_payload, arena_fds, arena_bytes = b"", [], 0
            if self._arena is not None:
                arena_payload, arena_fds = self._arena.region.descriptor()
                arena_bytes = self._arena.region.nbytes
            name = self._transport.name.encode()
            frames.send(
                RING,
                _RING.pack(
                    p.ring_slots,
                    p.slot_bytes,
                    arena_bytes,
                    len(ring_fds),
                    len(arena_fds),
                    len(name),
                )
                + name
                + struct.pack("<I", len(ring_payload))
                + ring_payload
                + arena_payload,
                ring_fds + arena_fds,
            )
            conn = _Conn(frames, ring, p.slot_bytes)
            with self._lock:
                self._conns.append(conn)
            while not self._closed.is_set():
                if (
                    conn.dl is None
                ):  # idle: poll so close() is noticed, without a partial-frame read
                    if not select.select([sock], [], [], 0.2)[0]:
                        continue
                    dl = Deadline.of(self.params.deadline_s, what="rdma_tensor frame")
                else:
                    dl = conn.dl
                try:
                    kind, body, fds = frames.recv(dl, "waiting for the sender")
                except ChannelTimeout:
                    return  # the sender stalled past its own deadline: drop its partial set
                _close_fds(fds)
                self._on_frame(conn, kind, body)
        except ChannelClosed:
            return
        except ChannelError as exc:
            try:
                frames.send(ERROR, str(exc).encode()[:4000])
            except ChannelError:
                pass
        finally:
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)
            if conn is not None:
                conn.reset()
            frames.close()
            if ring is not None:
                ring.close()

    def _on_frame(self, c: _Conn, kind: int, body: bytes) -> None:
        if kind == CHUNK:
            slot, offset, n = _CHUNK.unpack(body)
            flat = c.flat  # cancel() may clear it from another thread
            if flat is not None:
                if offset + n > flat.shape[0] or n > c.slot_bytes or slot >= self.params.ring_slots:
                    raise ChannelError(
                        f"rdma_tensor: chunk [{offset}, {offset + n}) outside the KV set"
                    )
                np.copyto(flat[offset : offset + n], c.ring.view(slot * c.slot_bytes, n))
            c.frames.send(FREE, _FREE.pack(slot))
        elif kind == BEGIN:
            self._begin(c, pb.KVTransfer.FromString(body))
        elif kind == END:
            self._end(c)
        elif kind == CANCEL:
            msg = pb.KVCancel.FromString(body)
            self._inbox.cancel(msg.seq_id, msg.reason or "cancelled by sender")
            c.reset()
        else:
            raise ChannelError(f"rdma_tensor: unexpected frame type {kind}")

    def _begin(self, c: _Conn, hdr: Any) -> None:
        reason = self._inbox.cancelled_reason(hdr.seq_id)
        if reason is not None:
            c.frames.send(
                ERROR, f"rdma_tensor: {hdr.seq_id!r} cancelled by receiver: {reason}".encode()
            )
            return
        c.hdr, c.dl = (
            hdr,
            Deadline.of(hdr.timeout_s + 1.0, what=f"rdma_tensor receive {hdr.seq_id!r}"),
        )
        layout = KVLayout.from_proto(hdr.layout)
        nbytes = hdr.num_blocks * layout.block_bytes
        place, dest = NO_PLACE, None
        if self._alloc is not None:
            dest = self._alloc(hdr.seq_id, hdr.num_blocks, layout)
        elif self._arena is not None and nbytes:
            got = self._arena.take(nbytes)
            if got is not None:  # direct: the tensor handed out will be this arena region
                place, region = got
                c.hold = region
                dest = layout.view(
                    region.reshape(hdr.num_blocks, layout.block_bytes), self._tensor_lib
                )
        c.landing = KVLanding(
            hdr.seq_id,
            hdr.num_blocks,
            hdr.token_start,
            hdr.token_end,
            hdr.block_size,
            layout,
            hashes_signed=hdr.hashes_signed,
            dest=dest,
            tensor_lib=self._tensor_lib,
            checksum=hdr.checksum or "xsum64",
        )
        c.flat = c.landing.rows.reshape(-1)
        c.hash_bits = np.array(hdr.block_hashes, dtype=np.uint64)
        c.frames.send(PLACE, _PLACE.pack(place))

    def _end(self, c: _Conn) -> None:
        hdr = c.hdr
        if hdr is None:
            raise ChannelError("rdma_tensor: END without BEGIN")
        landing = c.landing
        if landing is None:
            reason = self._inbox.cancelled_reason(hdr.seq_id) or "cancelled"
            c.frames.send(
                ERROR, f"rdma_tensor: {hdr.seq_id!r} cancelled by receiver: {reason}".encode()
            )
            c.reset()
            return
        sums = list(hdr.checksums) if len(hdr.checksums) else None
        _, rejected = landing.land_in_place(landing.missing(), c.hash_bits, sums)
        complete = landing.complete
        c.frames.send(
            RESULT,
            pb.KVAck(
                rejected=rejected, complete=complete, received_total=landing.count
            ).SerializeToString(),
        )
        if complete:
            result = landing.result()
            c.reset()
            del landing  # hold nothing: the worker's references alone keep an arena region alive
            self._inbox.put(result)


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


# ================================================================================== sender


class RdmaTensorSender:
    """Sends KVBlocks to one RdmaTensorReceiver. Sends on one sender are serialised (one ring);
    use one sender per concurrent stream of sends. `send` blocks until the receiver confirmed
    every block; `send_async` returns a Future."""

    def __init__(
        self,
        address: str,
        *,
        params: RdmaTensorParams = RdmaTensorParams(),
    ):
        self.address = address
        self.params = params
        self._lock = threading.Lock()
        self._frames: Frames | None = None
        self._ring: RegionWriter | None = None
        self._arena: RegionWriter | None = None
        self._free: list[int] = []
        self._slots = 0
        self._slot_bytes = 0
        self._current: str | None = None
        self._abort = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rdma_tensor_send")
        self._closed = False
        self.last_mode = ""  # "direct" or "ring": how the last set travelled

    def send(
        self,
        kv: KVBlocks | KVSource,
        *,
        timeout_s: float | None = None,
        deadline: float | None = None,
    ) -> TransferReport:
        if self._closed:
            raise ChannelClosed("rdma_tensor sender closed")
        src = kv if isinstance(kv, KVSource) else KVSource.of(kv, self.params.checksum or "xsum64")
        dl = Deadline.of(
            timeout_s if timeout_s is not None or deadline is not None else self.params.deadline_s,
            deadline,
            what=f"rdma_tensor send {src.kv.seq_id!r} to {self.address}",
        )
        t0 = time.perf_counter()
        with self._lock:
            self._abort.clear()
            self._current = src.kv.seq_id
            try:
                transfer_id, resent = self._send_locked(src, dl)
            except BaseException:
                self._disconnect()  # the ring's state is unknown now; the next send reconnects
                raise
            finally:
                self._current = None
        n = src.kv.num_blocks
        return TransferReport(
            transfer_id,
            src.kv.seq_id,
            n,
            n * src.layout.block_bytes,
            time.perf_counter() - t0,
            resent,
            0,
        )

    def send_async(self, kv: KVBlocks | KVSource, **kw: Any) -> Future[TransferReport]:
        return self._pool.submit(self.send, kv, **kw)

    def cancel(self, seq_id: str, reason: str = "cancelled by sender") -> None:
        """Abort a send of seq_id in progress (it raises ChannelCancelled) and tell the receiver to
        drop seq_id's KV; without a connection there is nothing to tell."""
        if self._current == seq_id:
            self._abort.set()
            return  # the sending thread sends CANCEL itself, in frame order
        with self._lock:
            if self._frames is not None:
                self._frames.send(
                    CANCEL, pb.KVCancel(seq_id=seq_id, reason=reason).SerializeToString()
                )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._abort.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._disconnect()

    def __enter__(self) -> RdmaTensorSender:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _connect(self, dl: Deadline) -> None:
        family, sockaddr = parse_address(self.address)
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(max(dl.remaining(), 1e-3))
        try:
            sock.connect(sockaddr)
        except TimeoutError:
            sock.close()
            raise dl.timeout("connecting") from None
        except OSError as exc:
            sock.close()
            raise ChannelClosed(f"rdma_tensor: cannot connect to {self.address}: {exc}") from None
        frames = Frames(sock)
        fds: list[int] = []
        try:
            frames.send(
                HELLO, pb.Hello(peer=f"pid{os.getpid()}", version=VERSION).SerializeToString()
            )
            kind, body, fds = frames.recv(dl, "waiting for the receiver's ring")
            if kind == ERROR:
                raise ChannelError(body.decode(errors="replace"))
            if kind != RING:
                raise ChannelError(f"rdma_tensor: expected RING, got frame {kind}")
            slots, slot_bytes, arena_bytes, n_ring_fds, n_arena_fds, nlen = _RING.unpack_from(body)
            at = _RING.size
            name = body[at : at + nlen].decode()
            (ring_len,) = struct.unpack_from("<I", body, at + nlen)
            at += nlen + 4
            ring_payload, arena_payload = body[at : at + ring_len], body[at + ring_len :]
            table = transports()
            if name not in table or not table[name].available():
                raise ChannelError(
                    f"rdma_tensor receiver uses transport {name!r}, which this sender cannot load"
                )
            transport: Transport = table[name]()
            ring_fds, arena_fds = fds[:n_ring_fds], fds[n_ring_fds : n_ring_fds + n_arena_fds]
            fds = []  # attach owns (and closes) them from here on
            self._ring = transport.attach(slots * slot_bytes, ring_payload, ring_fds)
            if arena_bytes:
                self._arena = transport.attach(arena_bytes, arena_payload, arena_fds)
        except BaseException:
            _close_fds(fds)
            frames.close()
            self._disconnect()
            raise
        self._frames, self._free, self._slots, self._slot_bytes = (
            frames,
            list(range(slots)),
            slots,
            slot_bytes,
        )

    def _disconnect(self) -> None:
        for w in (self._ring, self._arena):
            if w is not None:
                w.close()
        self._ring = self._arena = None
        if self._frames is not None:
            self._frames.close()
            self._frames = None

    def _send_locked(self, src: KVSource, dl: Deadline) -> tuple[str, int]:
        if self._frames is None:
            self._connect(dl)
        assert self._frames is not None and self._ring is not None
        frames = self._frames
        kv, bb = src.kv, src.layout.block_bytes
        hdr = pb.KVTransfer(
            transfer_id=uuid.uuid4().hex,
            seq_id=kv.seq_id,
            num_blocks=kv.num_blocks,
            token_start=kv.token_start,
            token_end=kv.token_end,
            block_size=kv.block_size,
            layout=src.layout.to_proto(pb),
            stream=0,
            num_streams=1,
            timeout_s=dl.remaining(),
            block_hashes=src.hashes.tolist(),
            hashes_signed=src.hashes_signed,
        )
        if self.params.checksum:
            hdr.checksum = src.checksum
            hdr.checksums.extend(src.sums(range(kv.num_blocks)))
        frames.send(BEGIN, hdr.SerializeToString())
        (place,) = _PLACE.unpack(
            self._expect(PLACE, dl, "waiting for the receiver to place the set")
        )
        direct = place != NO_PLACE
        if direct and self._arena is None:
            raise ChannelError(
                "rdma_tensor: receiver placed the set in an arena this sender has not mapped"
            )
        self.last_mode = "direct" if direct else "ring"
        flat = src.rows.reshape(-1)
        writers = [w for w in (self._ring, self._arena) if w is not None]
        for w in writers:
            w.begin(src.rows)
        todo = list(range(kv.num_blocks))
        rejections: dict[int, int] = {}
        resent = 0
        try:
            while True:
                piece_max = _DIRECT_PIECE if direct else self._slot_bytes
                for lo, hi in _pieces(todo, bb, piece_max):
                    if self._abort.is_set():
                        frames.send(
                            CANCEL,
                            pb.KVCancel(
                                seq_id=kv.seq_id, reason="cancelled by sender"
                            ).SerializeToString(),
                        )
                        raise ChannelCancelled(f"{dl.what}: cancelled by sender")
                    dl.check("writing KV")
                    self._write_piece(lo, flat[lo:hi], place if direct else None, dl)
                frames.send(END)
                ack = pb.KVAck.FromString(
                    self._expect(RESULT, dl, "waiting for the receiver to confirm")
                )
                if ack.complete:
                    return hdr.transfer_id, resent
                if not ack.rejected:
                    raise ChannelError(
                        f"{dl.what}: receiver reports {kv.num_blocks - ack.received_total} blocks "
                        "missing but rejected none"
                    )
                for b in ack.rejected:
                    rejections[b] = rejections.get(b, 0) + 1
                    if rejections[b] > self.params.max_block_retries:
                        raise ChannelCorrupt(
                            f"{dl.what}: block {b} failed its checksum {rejections[b]} times", [b]
                        )
                todo = sorted(ack.rejected)
                resent += len(todo)
        finally:
            for w in writers:
                w.end()

    def _write_piece(self, offset: int, piece: np.ndarray, place: int | None, dl: Deadline) -> None:
        """Bytes [offset, offset + len(piece)) of the set: straight into the arena region at
        `place`, or (place None) through a free ring slot that the receiver copies out."""
        if place is not None:
            self._arena.write_at(place + offset, piece, dl)  # type: ignore[union-attr]
            return
        slot = self._take_slot(dl)
        self._ring.write_at(slot * self._slot_bytes, piece, dl)  # type: ignore[union-attr]
        self._frames.send(CHUNK, _CHUNK.pack(slot, offset, piece.shape[0]))  # type: ignore[union-attr]

    def _take_slot(self, dl: Deadline) -> int:
        while not self._free:
            self._absorb(self._frames.recv(dl, "waiting for a free ring slot"), dl)  # type: ignore[union-attr]
        return self._free.pop()

    def _expect(self, want: int, dl: Deadline, doing: str) -> bytes:
        while True:
            kind, body = self._absorb(self._frames.recv(dl, doing), dl)  # type: ignore[union-attr]
            if kind == want:
                return body

    def _absorb(self, frame: tuple[int, bytes, list[int]], dl: Deadline) -> tuple[int, bytes]:
        kind, body, fds = frame
        _close_fds(fds)
        if kind == FREE:
            self._free.append(_FREE.unpack(body)[0])
        elif kind == ERROR:
            text = body.decode(errors="replace")
            if "cancelled" in text:
                raise ChannelCancelled(f"{dl.what}: {text}")
            raise ChannelError(f"{dl.what}: receiver error: {text}")
        elif kind not in (RESULT, PLACE):
            raise ChannelError(f"{dl.what}: unexpected frame type {kind}")
        return kind, body


def _pieces(blocks: list[int], block_bytes: int, max_bytes: int) -> Iterator[tuple[int, int]]:
    """(byte lo, byte hi) pieces of at most max_bytes over runs of consecutive blocks."""
    i = 0
    while i < len(blocks):
        j = i
        while j + 1 < len(blocks) and blocks[j + 1] == blocks[j] + 1:
            j += 1
        lo, end = blocks[i] * block_bytes, (blocks[j] + 1) * block_bytes
        while lo < end:
            hi = min(end, lo + max_bytes)
            yield lo, hi
            lo = hi
        i = j + 1
