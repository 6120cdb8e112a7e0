"""The control connection of an rdma_tensor channel: small length-prefixed frames over a stream
socket (an abstract Unix socket on one host, TCP for NIXL across hosts), with file descriptors
alongside on a Unix socket. Every receive has a deadline.
"""

from __future__ import annotations

import os
import socket
import struct
import time

from pddflow.channels.deadline import Deadline
from pddflow.channels.errors import ChannelClosed, ChannelError

_HEADER = struct.Struct("<IB")  # payload length, frame kind
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


def dial(address: str, dl: Deadline, what: str = "connecting") -> socket.socket:
    """A connected stream socket to `address` within the deadline (ChannelClosed if refused)."""
    family, sockaddr = parse_address(address)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(max(dl.remaining(), 1e-3))
    try:
        sock.connect(sockaddr)
    except TimeoutError:
        sock.close()
        raise dl.timeout(what) from None
    except OSError as exc:
        sock.close()
        raise ChannelClosed(f"rdma_tensor: cannot connect to {address}: {exc}") from None
    return sock


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


class ControlSocket:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.unix = sock.family == socket.AF_UNIX
        if not self.unix:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, kind: int, payload: bytes = b"", fds: list[int] | None = None) -> None:
        data = _HEADER.pack(len(payload), kind) + payload
        try:
            if fds:
                socket.send_fds(self.sock, [data], fds)
            else:
                self.sock.sendall(data)
        except OSError as exc:
            raise ChannelClosed(f"rdma_tensor peer went away: {exc}") from None

    def recv(self, dl: Deadline, doing: str = "") -> tuple[int, bytes, list[int]]:
        """(frame kind, payload, file descriptors that came with it: the caller closes them)."""
        fds: list[int] = []
        head = self._exact(_HEADER.size, dl, doing, fds)
        n, kind = _HEADER.unpack(head)
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

    def close_after_peer(self, timeout_s: float = 1.0) -> None:
        """Close once the peer has read what was sent: stop writing (the peer reads to our end),
        then read until it closes, for at most timeout_s. Closing with its frames unread here
        (FREEs) resets a TCP connection, and the peer loses frames of ours it had not read yet,
        such as a CANCEL after the last CHUNK; a Unix socket's peer fails its next send and stops
        reading the same way."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            end = time.monotonic() + timeout_s
            while (left := end - time.monotonic()) > 0:
                self.sock.settimeout(left)
                if not self.sock.recv(1 << 16):
                    break
        except OSError:
            pass
        self.sock.close()
