"""Regions over plain TCP, for rdma_tensor between hosts without NIXL: a region is ordinary
receiver memory; the writer opens a data connection to the receiver's own listening address
(ATTACH, after AUTH where the receiver has a token), sends each write as a header (offset,
length) and the raw bytes, and the receiver reads them straight into the region and answers with
the length, so a write is visible to the reader when `write_at` returns. No pickle: struct
headers and bytes."""

from __future__ import annotations

import secrets
import select
import socket
import struct
import threading

import numpy as np

from pddflow.channels.deadline import Deadline
from pddflow.channels.errors import ChannelClosed, ChannelError
from pddflow.channels.rdma_tensor.control_socket import ControlSocket, dial
from pddflow.channels.rdma_tensor.frames import Frame, refusal
from pddflow.channels.rdma_tensor.memory_region import Region, RegionBackend, RegionWriter

WRITE = struct.Struct("<QQ")  # writer -> receiver: offset in the region, length; then the bytes
DONE = struct.Struct("<Q")  # receiver -> writer: the length, once the bytes are in the region
REGION_ID_BYTES = 16  # random: a region is named by a value only the control connection carries
IDLE_POLL_S = 0.2  # an idle data connection wakes this often to notice the receiver closing


def _recv_exact_into(sock: socket.socket, view: memoryview, dl: Deadline, doing: str) -> None:
    got = 0
    while got < len(view):
        left = dl.remaining()
        if left <= 0:
            raise dl.timeout(doing)
        sock.settimeout(left)
        try:
            n = sock.recv_into(view[got:])
        except TimeoutError:
            raise dl.timeout(doing) from None
        except OSError as exc:
            raise ChannelClosed(f"rdma_tensor tcp peer went away: {exc}") from None
        if n == 0:
            raise ChannelClosed("rdma_tensor tcp peer closed the data connection")
        got += n


class TcpRegion(Region):
    def __init__(self, nbytes: int, populate: bool, registry: dict[bytes, TcpRegion]):
        self.nbytes = nbytes
        # zeros: calloc'd, so an arena's pages are committed on first write, as a memfd's are;
        # a ring (populate) is touched now so its first copies do not fault
        self._arr = np.zeros(nbytes, dtype=np.uint8)
        if populate:
            self._arr[::4096] = 0
        self.region_id = secrets.token_bytes(REGION_ID_BYTES)
        self._registry = registry
        registry[self.region_id] = self

    def view(self, offset: int, n: int) -> np.ndarray:
        return self._arr[offset : offset + n]

    def buffer(self) -> object:
        return self._arr

    def descriptor(self) -> tuple[bytes, list[int]]:
        return self.region_id, []

    def close(self) -> None:
        # the array stays while views handed out hold it; only new writes are refused
        self._registry.pop(self.region_id, None)


class TcpWriter(RegionWriter):
    """Connects on the first write (which has a deadline); one write in flight at a time."""

    def __init__(self, nbytes: int, region_id: bytes, address: str, token: str | None):
        self.nbytes, self.region_id, self.address, self.token = nbytes, region_id, address, token
        self._sock: socket.socket | None = None

    def _connect(self, dl: Deadline) -> socket.socket:
        sock = dial(self.address, dl, "connecting the tcp data connection")
        control = ControlSocket(sock)
        try:
            if self.token:
                control.send(Frame.AUTH, self.token.encode())
            control.send(Frame.ATTACH, self.region_id)
            kind, body, _ = control.recv(dl, "waiting for the receiver to accept the data link")
            if kind == Frame.ERROR:
                raise refusal(body)
            if kind != Frame.ATTACH or DONE.unpack(body)[0] < self.nbytes:
                raise ChannelError(f"rdma_tensor: bad answer to ATTACH from {self.address}")
        except BaseException:
            control.close()
            raise
        return sock

    def write_at(self, offset: int, src: np.ndarray, dl: Deadline) -> None:
        if offset + src.shape[0] > self.nbytes:
            raise ChannelError(f"rdma_tensor: write [{offset}, +{src.shape[0]}) past the region")
        if self._sock is None:
            self._sock = self._connect(dl)
        sock = self._sock
        try:
            # since Python 3.5 the timeout bounds the whole sendall, not each piece of it
            sock.settimeout(max(dl.remaining(), 1e-3))
            sock.sendall(WRITE.pack(offset, src.shape[0]))
            sock.sendall(memoryview(np.ascontiguousarray(src)).cast("B"))
            ack = bytearray(DONE.size)
            _recv_exact_into(sock, memoryview(ack), dl, "waiting for the receiver to take a write")
        except ChannelError:
            self.close()  # a half-done write leaves the stream unusable
            raise
        except TimeoutError:
            self.close()
            raise dl.timeout("sending over the tcp data connection") from None
        except OSError as exc:
            self.close()
            raise ChannelClosed(f"rdma_tensor tcp data connection broke: {exc}") from None
        except BaseException:
            self.close()
            raise
        if DONE.unpack(ack)[0] != src.shape[0]:
            self.close()
            raise ChannelError("rdma_tensor: the receiver acknowledged a different length")

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None


class TcpBackend(RegionBackend):
    name = "tcp"
    needs_unix_socket = False
    network = True  # bytes cross a wire: checksums on by default

    def __init__(self, address: str = "", token: str | None = None):
        self._regions: dict[bytes, TcpRegion] = {}
        self._lock = threading.Lock()
        self.address, self.token = address, token  # the sender's side: where to attach

    @classmethod
    def for_sender(cls, address: str, token: str | None) -> RegionBackend:
        return cls(address, token)

    def create_region(self, nbytes: int, populate: bool) -> Region:
        with self._lock:
            return TcpRegion(nbytes, populate, self._regions)

    def attach(self, nbytes: int, payload: bytes, fds: list[int]) -> RegionWriter:
        if fds or len(payload) != REGION_ID_BYTES:
            raise ChannelError("tcp region: the receiver's descriptor is not a region id")
        return TcpWriter(nbytes, payload, self.address, self.token)

    def serve_writer(
        self, control: ControlSocket, body: bytes, closed: threading.Event, deadline_s: float
    ) -> None:
        """A data connection after its ATTACH: take writes into the region until either side
        closes. Idle waits poll `closed`; a write's bytes must arrive within deadline_s."""
        region = self._regions.get(body)
        if region is None:
            control.send(Frame.ERROR, b"rdma_tensor: ATTACH names no region of this receiver")
            return
        control.send(Frame.ATTACH, DONE.pack(region.nbytes))
        sock = control.sock
        head = bytearray(WRITE.size)
        while not closed.is_set():
            if not select.select([sock], [], [], IDLE_POLL_S)[0]:
                continue
            dl = Deadline.of(deadline_s, what="rdma_tensor tcp write")
            _recv_exact_into(sock, memoryview(head), dl, "reading a write header")
            offset, n = WRITE.unpack(head)
            if offset + n > region.nbytes or region.region_id not in self._regions:
                raise ChannelError(
                    f"rdma_tensor: tcp write [{offset}, {offset + n}) outside a live region of "
                    f"{region.nbytes} bytes"
                )
            dest = memoryview(region.view(offset, n)).cast("B")
            _recv_exact_into(sock, dest, dl, "reading a write's bytes")
            try:
                sock.settimeout(max(dl.remaining(), 1e-3))  # the ack has the write's deadline
                sock.sendall(DONE.pack(n))
            except TimeoutError:
                raise dl.timeout("acknowledging a write") from None
            except OSError as exc:
                raise ChannelClosed(f"rdma_tensor tcp writer went away: {exc}") from None
