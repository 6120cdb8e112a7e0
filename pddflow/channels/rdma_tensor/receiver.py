"""The receiving end of an rdma_tensor channel: a listening control socket, a ring per sender
connection and one landing arena shared by all of them (protocol: `protocol.py`)."""

from __future__ import annotations

import ctypes
import hmac
import os
import select
import socket
import struct
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from pddflow.channels.deadline import Deadline
from pddflow.channels.errors import ChannelClosed, ChannelError, ChannelTimeout
from pddflow.channels.kv_inbox import KVInbox
from pddflow.channels.kv_landing import KVLanding
from pddflow.channels.kv_layout import KVLayout
from pddflow.channels.proto import pddflow_pb2 as pb
from pddflow.channels.rdma_tensor.control_socket import (
    ControlSocket,
    close_fds,
    format_address,
    parse_address,
)
from pddflow.channels.rdma_tensor.frames import Frame
from pddflow.channels.rdma_tensor.memory_region import Region
from pddflow.channels.rdma_tensor.protocol import (
    CHUNK_FORMAT,
    FREE_FORMAT,
    NO_PLACE,
    PLACE_FORMAT,
    RING_FORMAT,
    VERSION,
    SharedMemoryKVParams,
    pick_backend,
)
from pddflow.core.payloads import KVBlocks

Alloc = Callable[[str, int, KVLayout], Any]


class LandingArena:
    """First-fit allocator over the landing region.

    A region is handed out as an array whose memory is owned by a ctypes holder. numpy collapses
    view chains to the owner, so every view and tensor made from it keeps the holder alive; when
    the last one is gone the holder is collected and weakref.finalize returns the region. That
    is how a dropped KVBlocks frees its arena space."""

    ALIGN = 4096

    def __init__(self, region: Region):
        self.region = region
        self._free: list[tuple[int, int]] = [(0, region.nbytes)]
        self._lock = threading.Lock()

    def take(self, n: int) -> tuple[int, np.ndarray] | None:
        size = -(-max(n, 1) // self.ALIGN) * self.ALIGN
        with self._lock:
            for k, (offset, length) in enumerate(self._free):
                if length >= size:
                    rest = [(offset + size, length - size)] if length > size else []
                    self._free[k : k + 1] = rest
                    break
            else:
                return None
        holder = (ctypes.c_uint8 * n).from_buffer(self.region.buffer(), offset)
        weakref.finalize(holder, self._give_back, offset, size)
        return offset, np.frombuffer(holder, dtype=np.uint8)

    def _give_back(self, offset: int, size: int) -> None:
        with self._lock:
            self._free.append((offset, size))
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


class _SenderConnection:
    """One sender's control socket and ring, and the set it is sending now."""

    def __init__(self, control: ControlSocket, ring: Region, slot_bytes: int):
        self.control, self.ring, self.slot_bytes = control, ring, slot_bytes
        self.landing: KVLanding | None = None
        self.header: Any = None
        self.hash_bits: np.ndarray | None = None
        self.flat: np.ndarray | None = None
        self.dl: Deadline | None = None
        self.hold: np.ndarray | None = None  # the arena region the sender may still be writing

    def reset(self) -> None:
        """Forget the current set. Called only once the sender has stopped writing into its
        arena region (END, CANCEL or the connection's end), so the region cannot go to another
        set under a writer even when cancel() dropped the landing earlier."""
        self.landing = self.flat = self.header = self.dl = self.hash_bits = self.hold = None


class SharedMemoryKVReceiver:
    """Listens on `address` (default: a fresh abstract Unix socket name)."""

    def __init__(
        self,
        address: str | None = None,
        *,
        params: SharedMemoryKVParams = SharedMemoryKVParams(),
        alloc: Alloc | None = None,
        tensor_lib: str | None = None,
    ):
        self.params = params
        address = address or f"unix:@pddflow-shm-kv-{os.getpid()}-{uuid.uuid4().hex[:10]}"
        family, sockaddr = parse_address(address)
        self._backend = pick_backend(params.transport, unix=family == socket.AF_UNIX)
        if self._backend.needs_unix_socket and family != socket.AF_UNIX:
            raise ChannelError(
                f"rdma_tensor transport {self._backend.name!r} works between processes on one "
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
            LandingArena(self._backend.create_region(params.arena_bytes, populate=False))
            if params.arena_bytes and alloc is None
            else None
        )
        self._inbox = KVInbox("rdma_tensor")
        self._closed = threading.Event()
        self._conns: list[_SenderConnection] = []
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
        dl = Deadline.for_call(
            timeout_s,
            deadline,
            self.params.deadline_s,
            what=f"rdma_tensor recv{'(' + seq_id + ')' if seq_id else ''}",
        )
        return self._inbox.get(seq_id, dl)

    def cancel(self, seq_id: str, reason: str = "cancelled by receiver") -> None:
        """Drop seq_id's partial or unconsumed KV (its arena region returns) and refuse further
        blocks for it."""
        self._inbox.cancel(seq_id, reason)
        with self._lock:
            for c in self._conns:
                if c.header is not None and c.header.seq_id == seq_id:
                    c.landing = c.flat = None  # the serving thread notices at the next frame

    @property
    def transport(self) -> str:
        """The region backend this receiver offers: shm, tcp or nixl."""
        return self._backend.name

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

    def __enter__(self) -> SharedMemoryKVReceiver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

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
        control = ControlSocket(sock)
        ring: Region | None = None
        conn: _SenderConnection | None = None
        try:
            handshake = Deadline.of(10.0, what="rdma_tensor handshake")
            kind, body, fds = control.recv(handshake, "waiting for HELLO")
            close_fds(fds)
            if self.params.token:
                if kind != Frame.AUTH or not hmac.compare_digest(body, self.params.token.encode()):
                    what = "wrong" if kind == Frame.AUTH else "missing"
                    control.send(
                        Frame.ERROR,
                        f"rdma_tensor: {what} token (this receiver requires the deployment's "
                        "token)".encode(),
                    )
                    return
                kind, body, fds = control.recv(handshake, "waiting for HELLO")
                close_fds(fds)
            if kind == Frame.ATTACH:  # a data link of the tcp backend, not a control connection
                self._backend.serve_writer(control, body, self._closed, self.params.deadline_s)
                return
            if kind != Frame.HELLO or pb.Hello.FromString(body).version != VERSION:
                control.send(
                    Frame.ERROR, b"rdma_tensor: bad handshake (protocol version mismatch?)"
                )
                return
            ring = self._backend.create_region(
                self.params.ring_slots * self.params.slot_bytes, populate=True
            )
            self._send_ring(control, ring)
            conn = _SenderConnection(control, ring, self.params.slot_bytes)
            with self._lock:
                self._conns.append(conn)
            while not self._closed.is_set():
                if conn.dl is None:
                    # idle: poll, so close() is noticed without leaving a frame half read
                    if not select.select([sock], [], [], 0.2)[0]:
                        continue
                    dl = Deadline.of(self.params.deadline_s, what="rdma_tensor frame")
                else:
                    dl = conn.dl
                try:
                    kind, body, fds = control.recv(dl, "waiting for the sender")
                except ChannelTimeout:
                    return  # the sender stalled past its own deadline: drop its partial set
                close_fds(fds)
                self._on_frame(conn, kind, body)
        except ChannelClosed:
            return
        except ChannelError as exc:
            try:
                control.send(Frame.ERROR, str(exc).encode()[:4000])
            except ChannelError:
                pass
        finally:
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)
            if conn is not None:
                conn.reset()
            control.close()
            if ring is not None:
                ring.close()

    def _send_ring(self, control: ControlSocket, ring: Region) -> None:
        """RING: the backend's name, the ring and the arena, with their file descriptors."""
        p = self.params
        ring_payload, ring_fds = ring.descriptor()
        arena_payload, arena_fds, arena_bytes = b"", [], 0
        if self._arena is not None:
            arena_payload, arena_fds = self._arena.region.descriptor()
            arena_bytes = self._arena.region.nbytes
        name = self._backend.name.encode()
        head = RING_FORMAT.pack(
            p.ring_slots, p.slot_bytes, arena_bytes, len(ring_fds), len(arena_fds), len(name)
        )
        body = head + name + struct.pack("<I", len(ring_payload)) + ring_payload + arena_payload
        control.send(Frame.RING, body, ring_fds + arena_fds)

    def _on_frame(self, c: _SenderConnection, kind: int, body: bytes) -> None:
        if kind == Frame.CHUNK:
            slot, offset, n = CHUNK_FORMAT.unpack(body)
            flat = c.flat  # cancel() may clear it from another thread
            if flat is not None:
                if offset + n > flat.shape[0] or n > c.slot_bytes or slot >= self.params.ring_slots:
                    raise ChannelError(
                        f"rdma_tensor: chunk [{offset}, {offset + n}) outside the KV set"
                    )
                np.copyto(flat[offset : offset + n], c.ring.view(slot * c.slot_bytes, n))
            c.control.send(Frame.FREE, FREE_FORMAT.pack(slot))
        elif kind == Frame.BEGIN:
            self._begin(c, pb.KVTransfer.FromString(body))
        elif kind == Frame.END:
            self._end(c)
        elif kind == Frame.CANCEL:
            msg = pb.KVCancel.FromString(body)
            self._inbox.cancel(msg.seq_id, msg.reason or "cancelled by sender")
            c.reset()
        else:
            raise ChannelError(f"rdma_tensor: unexpected frame type {kind}")

    def _begin(self, c: _SenderConnection, header: Any) -> None:
        reason = self._inbox.cancelled_reason(header.seq_id)
        if reason is not None:
            _refuse_cancelled(c, header.seq_id, reason)
            return
        c.header = header
        c.dl = Deadline.of(header.timeout_s + 1.0, what=f"rdma_tensor receive {header.seq_id!r}")
        layout = KVLayout.from_proto(header.layout)
        nbytes = header.num_blocks * layout.block_bytes
        place, dest = NO_PLACE, None
        if self._alloc is not None:
            dest = self._alloc(header.seq_id, header.num_blocks, layout)
        elif self._arena is not None and nbytes:
            got = self._arena.take(nbytes)
            if got is not None:  # direct: the tensor handed out will be this arena region
                place, region = got
                c.hold = region
                dest = layout.view(
                    region.reshape(header.num_blocks, layout.block_bytes), self._tensor_lib
                )
        c.landing = KVLanding.from_transfer(header, layout, dest, self._tensor_lib)
        c.flat = c.landing.rows.reshape(-1)
        c.hash_bits = np.array(header.block_hashes, dtype=np.uint64)
        c.control.send(Frame.PLACE, PLACE_FORMAT.pack(place))

    def _end(self, c: _SenderConnection) -> None:
        header = c.header
        if header is None:
            raise ChannelError("rdma_tensor: END without BEGIN")
        landing = c.landing
        if landing is None:
            reason = self._inbox.cancelled_reason(header.seq_id) or "cancelled"
            _refuse_cancelled(c, header.seq_id, reason)
            c.reset()
            return
        sums = list(header.checksums) if len(header.checksums) else None
        _, rejected = landing.land_in_place(landing.missing(), c.hash_bits, sums)
        complete = landing.complete
        ack = pb.KVAck(rejected=rejected, complete=complete, received_total=landing.count)
        c.control.send(Frame.RESULT, ack.SerializeToString())
        if complete:
            result = landing.result()
            c.reset()
            del landing  # hold nothing: the worker's references alone keep an arena region alive
            self._inbox.put(result)


def _refuse_cancelled(c: _SenderConnection, seq_id: str, reason: str) -> None:
    # the sender reads "cancelled" in an ERROR as ChannelCancelled
    message = f"rdma_tensor: {seq_id!r} cancelled by receiver: {reason}"
    c.control.send(Frame.ERROR, message.encode())
