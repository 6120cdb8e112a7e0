"""A small TCP relay for measuring and breaking real channels on loopback.

It sits between a client and a server and forwards bytes both ways on threads, counting them
(the wire size of a message as TCP payload), and can inject the faults a WAN produces: dropping
every live connection once after N client bytes (a link flap mid-transfer), flipping one byte of
the first occurrence of a marker in the client's stream (corruption that TCP's checksum missed,
e.g. a bad middlebox), and throttling chosen connections (one slow path among several). Used by the channel tests and `pddflow bench`.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass
class ProxyStats:
    up_bytes: int = 0  # client -> server
    down_bytes: int = 0  # server -> client
    connections: int = 0
    kills: int = 0
    corruptions: int = 0
    per_connection_up: list[int] = field(
        default_factory=list
    )  # client -> server bytes, by connection
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class TcpProxy:
    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        kill_after_up_bytes: int | None = None,
        corrupt_marker: bytes | None = None,
        throttle: dict[int, float] | None = None,
        host: str = "127.0.0.1",
    ):
        self.upstream = upstream
        self.throttle = dict(
            throttle or {}
        )  # connection number -> client->server bytes/s (a slow path)
        self.kill_after = kill_after_up_bytes
        self.marker = corrupt_marker
        self.stats = ProxyStats()
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.address = f"{host}:{self.port}"
        self._conns: list[socket.socket] = []
        self._down_until = 0.0  # cut(): refuse connections until then
        self._cut_at: int | None = None  # cut(after_bytes=...): drop once up_bytes reaches this
        self._cut_for = 0.0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(
            target=self._accept_loop, daemon=True, name="tcpproxy-accept"
        )
        self._accept.start()

    def reset_counters(self) -> None:
        with self.stats.lock:
            self.stats.up_bytes = self.stats.down_bytes = 0

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if time.monotonic() < self._down_until:  # the link is down: nothing gets through
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.stats.lock:
                self.stats.connections += 1
                self.stats.per_connection_up.append(0)
                conn_no = len(self.stats.per_connection_up) - 1
                self._conns += [client, server]
            for src, dst, up in ((client, server, True), (server, client, False)):
                t = threading.Thread(
                    target=self._pump,
                    args=(src, dst, up, conn_no),
                    daemon=True,
                    name="tcpproxy-pump",
                )
                t.start()
                self._threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool, conn_no: int) -> None:
        try:
            while True:
                data = src.recv(1 << 20)
                if not data:
                    break
                kill = False
                with self.stats.lock:
                    if up:
                        if self.marker is not None and self.stats.corruptions == 0:
                            at = data.find(self.marker)
                            if at >= 0:
                                b = bytearray(data)
                                b[at] ^= 0xFF
                                data = bytes(b)
                                self.stats.corruptions += 1
                        self.stats.up_bytes += len(data)
                        self.stats.per_connection_up[conn_no] += len(data)
                        if (
                            self.kill_after is not None
                            and self.stats.kills == 0
                            and self.stats.up_bytes >= self.kill_after
                        ):
                            self.stats.kills += 1
                            kill = True
                        if self._cut_at is not None and self.stats.up_bytes >= self._cut_at:
                            self._cut_at = None
                            self._down_until = time.monotonic() + self._cut_for
                            self.stats.kills += 1
                            kill = True
                    else:
                        self.stats.down_bytes += len(data)
                if kill:
                    self.drop_all()
                    return
                if up and conn_no in self.throttle:
                    time.sleep(len(data) / self.throttle[conn_no])
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self, seconds: float, after_bytes: int = 0) -> None:
        """Take the link down for `seconds`: live connections are reset and new ones refused.
        With after_bytes, the cut happens once that many more client bytes have passed (mid-transfer)."""
        if after_bytes > 0:
            with self.stats.lock:
                self._cut_for = seconds
                self._cut_at = self.stats.up_bytes + after_bytes
            return
        self._down_until = time.monotonic() + seconds
        self.drop_all()

    def drop_all(self) -> None:
        """Reset every live connection (RST, like a link that went away)."""
        with self.stats.lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._accept.join(timeout=2)
        self.drop_all()
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlackHole:
    """A TCP server that accepts connections and never answers: the peer that hangs."""

    def __init__(self, host: str = "127.0.0.1"):
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.address = f"{host}:{self.port}"
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True, name="blackhole")
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self._sock.accept()
                self._held.append(c)  # hold it open, read nothing, write nothing
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._t.join(timeout=2)
        for c in self._held:
            c.close()

    def __enter__(self) -> BlackHole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
