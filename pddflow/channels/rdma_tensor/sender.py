"""The sending end of an rdma_tensor channel: attaches to the receiver's ring and arena and writes
each KV set into them (protocol: `protocol.py`)."""

from __future__ import annotations

import os
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from pddflow.channels.codec_kv import KVSource
from pddflow.channels.deadline import Deadline
from pddflow.channels.errors import ChannelCancelled, ChannelClosed, ChannelCorrupt, ChannelError
from pddflow.channels.first_token import first_to_pb
from pddflow.channels.kv_checksum import DEFAULT_CHECKSUM
from pddflow.channels.proto import pddflow_pb2 as pb
from pddflow.channels.rdma_tensor.control_socket import ControlSocket, close_fds, dial
from pddflow.channels.rdma_tensor.frames import Frame, refusal
from pddflow.channels.rdma_tensor.memory_region import RegionWriter
from pddflow.channels.rdma_tensor.protocol import (
    CHUNK_FORMAT,
    DIRECT_PIECE,
    FREE_FORMAT,
    NO_PLACE,
    PLACE_FORMAT,
    RING_FORMAT,
    VERSION,
    SharedMemoryKVParams,
    region_backends,
)
from pddflow.channels.transfer import TransferReport
from pddflow.core.payloads import KVBlocks


class SharedMemoryKVSender:
    """Sends on one sender are serialised (one ring): one sender per concurrent stream of sends."""

    def __init__(self, address: str, *, params: SharedMemoryKVParams = SharedMemoryKVParams()):
        self.address = address
        self.params = params
        self._lock = threading.Lock()
        self._control: ControlSocket | None = None
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
        self.transport = ""  # the receiver's region backend, once connected: shm, tcp or nixl
        self._checksum: str | None = None  # what the sets carry over that backend

    def send(
        self,
        kv: KVBlocks | KVSource,
        *,
        timeout_s: float | None = None,
        deadline: float | None = None,
    ) -> TransferReport:
        if self._closed:
            raise ChannelClosed("rdma_tensor sender closed")
        checksum = self.params.checksum
        src = (
            kv
            if isinstance(kv, KVSource)
            else KVSource.of(kv, DEFAULT_CHECKSUM if checksum in (None, "auto") else checksum)
        )
        dl = Deadline.for_call(
            timeout_s,
            deadline,
            self.params.deadline_s,
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
            if self._control is not None:
                self._control.send(
                    Frame.CANCEL, pb.KVCancel(seq_id=seq_id, reason=reason).SerializeToString()
                )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._abort.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._disconnect()

    def __enter__(self) -> SharedMemoryKVSender:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _connect(self, dl: Deadline) -> None:
        sock = dial(self.address, dl, "connecting")
        control = ControlSocket(sock)
        fds: list[int] = []
        try:
            if self.params.token:
                control.send(Frame.AUTH, self.params.token.encode())
            control.send(
                Frame.HELLO, pb.Hello(peer=f"pid{os.getpid()}", version=VERSION).SerializeToString()
            )
            kind, body, fds = control.recv(dl, "waiting for the receiver's ring")
            if kind == Frame.ERROR:
                raise refusal(body)
            if kind != Frame.RING:
                raise ChannelError(f"rdma_tensor: expected RING, got frame {kind}")
            slots, slot_bytes, arena_bytes, n_ring_fds, n_arena_fds, name_len = (
                RING_FORMAT.unpack_from(body)
            )
            at = RING_FORMAT.size
            name = body[at : at + name_len].decode()
            (ring_len,) = struct.unpack_from("<I", body, at + name_len)
            at += name_len + 4
            ring_payload, arena_payload = body[at : at + ring_len], body[at + ring_len :]
            table = region_backends()
            if name not in table or not table[name].available():
                raise ChannelError(
                    f"rdma_tensor receiver uses transport {name!r}, which this sender cannot load"
                )
            if self.params.transport not in ("auto", name):
                raise ChannelError(
                    f"rdma_tensor: this sender wants transport {self.params.transport!r} but the "
                    f"receiver at {self.address} offers {name!r}"
                )
            backend = table[name].for_sender(self.address, self.params.token)
            self._checksum = self.params.checksum_over(backend)
            self.transport = name
            ring_fds, arena_fds = fds[:n_ring_fds], fds[n_ring_fds : n_ring_fds + n_arena_fds]
            fds = []  # attach owns (and closes) them from here on
            self._ring = backend.attach(slots * slot_bytes, ring_payload, ring_fds)
            if arena_bytes:
                self._arena = backend.attach(arena_bytes, arena_payload, arena_fds)
        except BaseException:
            close_fds(fds)
            control.close()
            self._disconnect()
            raise
        self._control = control
        self._free = list(range(slots))
        self._slots, self._slot_bytes = slots, slot_bytes

    def _disconnect(self) -> None:
        for w in (self._ring, self._arena):
            if w is not None:
                w.close()
        self._ring = self._arena = None
        if self._control is not None:
            self._control.close_after_peer()  # its last frames (a CANCEL) are read first
            self._control = None

    def _send_locked(self, src: KVSource, dl: Deadline) -> tuple[str, int]:
        if self._control is None:
            self._connect(dl)
        assert self._control is not None and self._ring is not None
        control = self._control
        kv, block_bytes = src.kv, src.layout.block_bytes
        header = pb.KVTransfer(
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
        if kv.heads is not None:
            header.head_start, header.head_end = kv.heads
        first_to_pb(header, kv.first)
        if self._checksum:
            header.checksum = src.checksum
            header.checksums.extend(src.sums(range(kv.num_blocks)))
        control.send(Frame.BEGIN, header.SerializeToString())
        (place,) = PLACE_FORMAT.unpack(
            self._expect(Frame.PLACE, dl, "waiting for the receiver to place the set")
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
                piece_max = DIRECT_PIECE if direct else self._slot_bytes
                for lo, hi in _pieces(todo, block_bytes, piece_max):
                    if self._abort.is_set():
                        cancel = pb.KVCancel(seq_id=kv.seq_id, reason="cancelled by sender")
                        control.send(Frame.CANCEL, cancel.SerializeToString())
                        raise ChannelCancelled(f"{dl.what}: cancelled by sender")
                    dl.check("writing KV")
                    self._write_piece(lo, flat[lo:hi], place if direct else None, dl)
                control.send(Frame.END)
                ack = pb.KVAck.FromString(
                    self._expect(Frame.RESULT, dl, "waiting for the receiver to confirm")
                )
                if ack.complete:
                    return header.transfer_id, resent
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
        self._control.send(Frame.CHUNK, CHUNK_FORMAT.pack(slot, offset, piece.shape[0]))  # type: ignore[union-attr]

    def _take_slot(self, dl: Deadline) -> int:
        while not self._free:
            self._absorb(self._control.recv(dl, "waiting for a free ring slot"), dl)  # type: ignore[union-attr]
        return self._free.pop()

    def _expect(self, want: int, dl: Deadline, doing: str) -> bytes:
        while True:
            kind, body = self._absorb(self._control.recv(dl, doing), dl)  # type: ignore[union-attr]
            if kind == want:
                return body

    def _absorb(self, frame: tuple[int, bytes, list[int]], dl: Deadline) -> tuple[int, bytes]:
        """Take in a frame from the receiver: a freed slot, an error, or what _expect waits for."""
        kind, body, fds = frame
        close_fds(fds)
        if kind == Frame.FREE:
            self._free.append(FREE_FORMAT.unpack(body)[0])
        elif kind == Frame.ERROR:
            text = body.decode(errors="replace")
            if "cancelled" in text:
                raise ChannelCancelled(f"{dl.what}: {text}")
            raise ChannelError(f"{dl.what}: receiver error: {text}")
        elif kind not in (Frame.RESULT, Frame.PLACE):
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
