"""The data plane under rdma_tensor: memory regions owned by the receiver and written by the
sender, plus the control connection both sides talk over.

A receiver owns two regions per sender connection: a ring of slots (staging: the sender copies a
run of bytes into a free slot, the receiver copies it out) and, when enabled, a shared landing
arena (the sender writes blocks straight into the receiver's destination, as an RDMA write into
registered memory would, and the receiver hands that memory out without copying).

`Transport` is what a backend implements: the receiver creates a `Region`, describes it in bytes
(+ file descriptors on one host); the sender attaches a `RegionWriter` whose `write_at(offset,
src)` puts bytes into it; when it returns, the receiver may read them. Everything else (credits,
checksums, resends, landing, cancel) is the protocol in `rdma_tensor.py`, shared by all backends.

Backends:
  shm   two processes on one host: a region is a memfd mapped by both (the fd crosses the Unix
        control socket with SCM_RIGHTS, so there is no name to leak: the memory is gone when both
        ends close it). A write is one memcpy into the mapping.
  nixl  NVIDIA NIXL (UCX and friends: RDMA, NVLink), where `nixl` is importable; see rdma_nixl.py.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from pddflow.channels.deadline import Deadline
from pddflow.channels.errors import ChannelClosed, ChannelError


class Region(ABC):
    """Receiver side: `nbytes` of memory a sender can write into."""

    nbytes: int

    @abstractmethod
    def view(self, offset: int, n: int) -> np.ndarray:
        """uint8 view of [offset, offset + n) (valid until close)."""

    @abstractmethod
    def buffer(self) -> object:
        """The writable buffer object behind the region (for views that must own a reference)."""

    @abstractmethod
    def descriptor(self) -> tuple[bytes, list[int]]:
        """What the writer needs to attach: a payload and file descriptors to pass (may be empty)."""

    @abstractmethod
    def close(self) -> None: ...


class RegionWriter(ABC):
    """Sender side: writes into a receiver's region."""

    def begin(self, src_rows: np.ndarray) -> None:
        """A send of src_rows (uint8 [blocks, block_bytes]) starts: register it if the backend must."""

    def end(self) -> None:
        """The send ended (successfully or not): release what begin registered."""

    @abstractmethod
    def write_at(self, offset: int, src: np.ndarray, dl: Deadline) -> None:
        """Copy src (1-D uint8) to [offset, offset + len); visible to the reader on return."""

    @abstractmethod
    def close(self) -> None: ...


class Transport(ABC):
    name: ClassVar[str]
    needs_unix_socket: ClassVar[bool] = False

    @staticmethod
    def available() -> bool:
        return True

    @abstractmethod
    def create_region(self, nbytes: int, populate: bool) -> Region:
        """populate: commit the pages now (a small, hot ring) rather than on first touch (an arena)."""

    @abstractmethod
    def attach(self, nbytes: int, payload: bytes, fds: list[int]) -> RegionWriter: ...


# ------------------------------------------------------------------------------------------ shm

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class _ShmRegion(Region):
    def __init__(self, nbytes: int, populate: bool):
        self.nbytes = nbytes
        self.fd = os.memfd_create("pddflow-rdma", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, nbytes)
            self._mm = mmap.mmap(
                self.fd, nbytes, flags=mmap.MAP_SHARED | (_POPULATE if populate else 0)
            )
        except BaseException:
            os.close(self.fd)
            raise
        self._arr = np.frombuffer(self._mm, dtype=np.uint8)

    def view(self, offset: int, n: int) -> np.ndarray:
        return self._arr[offset : offset + n]

    def buffer(self) -> object:
        return self._mm

    def descriptor(self) -> tuple[bytes, list[int]]:
        return b"", [self.fd]

    def close(self) -> None:
        self._arr = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:  # views handed out are still alive; the mapping goes when they do
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _ShmWriter(RegionWriter):
    def __init__(self, nbytes: int, fd: int):
        try:
            size = os.fstat(fd).st_size
            if size < nbytes:
                raise ChannelError(f"shared region is {size} bytes, expected {nbytes}")
            self._mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)  # the mapping keeps the memory alive
        self._arr = np.frombuffer(self._mm, dtype=np.uint8)

    def write_at(self, offset: int, src: np.ndarray, dl: Deadline) -> None:
        np.copyto(
            self._arr[offset : offset + src.shape[0]], src
        )  # numpy drops the GIL for the copy

    def close(self) -> None:
        self._arr = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:
            pass


class ShmTransport(Transport):
    name = "shm"
    needs_unix_socket = True

    def create_region(self, nbytes: int, populate: bool) -> Region:
        return _ShmRegion(nbytes, populate)

    def attach(self, nbytes: int, payload: bytes, fds: list[int]) -> RegionWriter:
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise ChannelError(
                f"shm region: expected 1 file descriptor from the receiver, got {len(fds)}"
            )
        return _ShmWriter(nbytes, fds[0])


def transports() -> dict[str, type[Transport]]:
    from pddflow.channels.rdma_nixl import NixlTransport

    return {"shm": ShmTransport, "nixl": NixlTransport}


def pick_transport(name: str = "auto") -> Transport:
    """`auto`: NIXL where it is importable, else shared memory."""
    table = transports()
    if name == "auto":
        name = "nixl" if table["nixl"].available() else "shm"
    if name not in table:
        raise ChannelError(
            f"unknown rdma_tensor transport {name!r}; valid: auto, {', '.join(sorted(table))}"
        )
    cls = table[name]
    if not cls.available():
        raise ChannelError(
            f"rdma_tensor transport {name!r} is not available here (its library is not importable)"
        )
    return cls()


# ---------------------------------------------------------------------------- control connection

_HDR = struct.Struct("<IB")  # payload length, frame type
MAX_FRAME = 64 << 20


def parse_address(address: str) -> tuple[int, object]:
    """`unix:@name` (abstract), `unix:/path`, or `tcp:host:port` -> (family, sockaddr)."""
    if address.startswith("unix:"):
        rest = address[5:]
        return socket.AF_UNIX, ("\0" + rest[1:]) if rest.startswith("@") else rest
    if address.startswith("tcp:"):
        host, _, port = address[4:].rpartition(":")
        return socket.AF_INET, (host, int(port))
    raise ChannelError(
        f"bad rdma_tensor address {address!r}: use unix:@name, unix:/path or tcp:host:port"
    )


def format_address(family: int, sockaddr: object) -> str:
    if family == socket.AF_UNIX:
        name = sockaddr.decode() if isinstance(sockaddr, bytes) else str(sockaddr)
        return "unix:@" + name[1:] if name.startswith("\0") else "unix:" + name
    host, port = sockaddr[:2]  # type: ignore[index]
    return f"tcp:{host}:{port}"


class Frames:
    """Length-prefixed frames over a stream socket; every receive has a deadline."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.unix = sock.family == socket.AF_UNIX
        if not self.unix:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, kind: int, payload: bytes = b"", fds: list[int] | None = None) -> None:
        data = _HDR.pack(len(payload), kind) + payload
        try:
            if fds:
                socket.send_fds(self.sock, [data], fds)
            else:
                self.sock.sendall(data)
        except OSError as exc:
            raise ChannelClosed(f"rdma_tensor peer went away: {exc}") from None

    def recv(self, dl: Deadline, doing: str = "") -> tuple[int, bytes, list[int]]:
        fds: list[int] = []
        head = self._exact(_HDR.size, dl, doing, fds)
        n, kind = _HDR.unpack(head)
        if n > MAX_FRAME:
            raise ChannelError(f"rdma_tensor control frame of {n} bytes exceeds {MAX_FRAME}")
        return kind, self._exact(n, dl, doing, fds) if n else b"", fds

    def _exact(self, n: int, dl: Deadline, doing: str, fds: list[int]) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = dl.remaining()
            if left <= 0:
                raise dl.timeout(doing)
            self.sock.settimeout(left)
            try:
                if self.unix:
                    data, got, _, _ = socket.recv_fds(self.sock, n - len(buf), 4)
                    fds += got
                else:
                    data = self.sock.recv(n - len(buf))
            except TimeoutError:
                raise dl.timeout(doing) from None
            except OSError as exc:
                raise ChannelClosed(f"rdma_tensor peer went away: {exc}") from None
            if not data:
                raise ChannelClosed("rdma_tensor peer closed the connection")
            buf += data
        return bytes(buf)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
