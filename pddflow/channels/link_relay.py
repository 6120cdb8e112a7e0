"""The TCP relay an emulated link's connections cross, counting bytes, so the link can be cut
(connections reset) or impaired (a partition, one way or both, or packet loss). The data channels'
senders shape bandwidth and delay (`emulation.py`); a control relay, whose ends do not, adds the
link's one-way delay itself."""

from __future__ import annotations

import queue
import random
import socket
import threading
import time
from dataclasses import dataclass, field

from pddflow.core.thread_name import name_os_thread

# SO_LINGER on, timeout 0: close() sends RST, as a link that went away does
_RESET_ON_CLOSE = b"\x01\x00\x00\x00\x00\x00\x00\x00"
PIECE = 64 << 10  # a lossy link loses (and a delayed one delays) data this much at a time
# a lost piece arrives after TCP's retransmission timeout: Linux's minimum, doubled on each loss
# in a row (backoff), at most RTO_MAX here (the emulated impairments last seconds, not minutes)
RTO_MIN_S, RTO_MAX_S = 0.2, 2.0
RELAY_THREAD = "link-relay"  # the OS name of a relay's threads (what CPU the emulation takes)
HELD = 64  # pieces a direction takes in before it stops reading (TCP's window: backpressure)


@dataclass(frozen=True)
class Impairment:
    """Until `until` (monotonic), data sent from `from_cluster` (every cluster: None) is lost
    with probability `loss`; 1.0 is a partition: nothing crosses, and what was sent arrives when
    it heals, as TCP retransmits it (a connection whose ends gave up meanwhile is gone)."""

    until: float
    loss: float = 1.0
    from_cluster: str | None = None


@dataclass
class RelayStats:
    up_bytes: int = 0  # client -> server
    down_bytes: int = 0  # server -> client
    connections: int = 0
    cuts: int = 0
    per_connection_up: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class Link:
    """The relays of one emulated link: it goes down as a whole, and a cut after N bytes counts
    what crossed every relay of it (the KV and the token-ID connections alike)."""

    def __init__(self) -> None:
        self.relays: list[LinkRelay] = []
        self.lock = threading.Lock()
        self.up_bytes = 0
        self._cut_at: int | None = None  # a pending cut: once up_bytes reaches this
        self._cut_for = 0.0
        self.impairment: Impairment | None = None

    def impair(self, seconds: float, loss: float = 1.0, from_cluster: str | None = None) -> None:
        """Partition the link (loss 1.0) or make it lossy for `seconds`, both ways or only for
        data sent from `from_cluster`; connections stay open (no reset: the peers' own
        keepalives and deadlines decide)."""
        if not 0 < loss <= 1:
            raise ValueError(f"loss must be in (0, 1], got {loss:g}")
        self.impairment = Impairment(time.monotonic() + seconds, loss, from_cluster)

    def impaired(self, src_cluster: str) -> Impairment | None:
        """The impairment on data sent from `src_cluster` now, if any."""
        imp = self.impairment
        if imp is None or time.monotonic() >= imp.until:
            return None
        if imp.from_cluster is not None and imp.from_cluster != src_cluster:
            return None
        return imp

    def cut(self, seconds: float, after_bytes: int = 0) -> None:
        """Reset live connections and refuse new ones for `seconds`, now or after_bytes later."""
        if after_bytes > 0:
            with self.lock:
                self._cut_for, self._cut_at = seconds, self.up_bytes + after_bytes
            return
        for relay in self.relays:
            relay.go_down(seconds)

    def crossed(self, nbytes: int) -> bool:
        """Count bytes crossing up; True when that made a pending cut fall due (then done)."""
        with self.lock:
            self.up_bytes += nbytes
            if self._cut_at is None or self.up_bytes < self._cut_at:
                return False
            self._cut_at = None
            seconds = self._cut_for
        self.cut(seconds)
        return True


class LinkRelay:
    """Connections to `upstream` through `link`. `client_cluster` / `server_cluster` say which
    side each direction leaves from (a one-way impairment applies to one); `delay_s` is added to
    every piece each way. A `control` relay carries control connections: their ends do not shape
    the link, so it adds the delay, and their bytes do not count towards a cut after N bytes
    (which is about the data channels')."""

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        host: str = "127.0.0.1",
        link: Link | None = None,
        client_cluster: str = "",
        server_cluster: str = "",
        delay_s: float = 0.0,
        control: bool = False,
        seed: int = 0,
    ):
        self.upstream = upstream
        self.link = link or Link()
        self.link.relays.append(self)
        self.client_cluster, self.server_cluster = client_cluster, server_cluster
        self.delay_s, self.control = delay_s, control
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self.stats = RelayStats()
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.address = f"{host}:{self.port}"
        self._conns: list[socket.socket] = []
        self._down_until = 0.0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(
            target=self._accept_loop, daemon=True, name="link-relay-accept"
        )
        self._accept.start()

    def cut(self, seconds: float, after_bytes: int = 0) -> None:
        """Cut this relay's whole link (see `Link.cut`)."""
        self.link.cut(seconds, after_bytes)

    def go_down(self, seconds: float) -> None:
        with self.stats.lock:
            self._down_until = time.monotonic() + seconds
            self.stats.cuts += 1
        self.drop_all()

    def drop_all(self) -> None:
        with self.stats.lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def reset_counters(self) -> None:
        with self.stats.lock:
            self.stats.up_bytes = self.stats.down_bytes = 0

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._accept.join(timeout=2)
        self.drop_all()
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> LinkRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        name_os_thread(RELAY_THREAD)
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if time.monotonic() < self._down_until:
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
                    name="link-relay-pump",
                )
                t.start()
                self._threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool, conn_no: int) -> None:
        """Read one direction; a writer delivers each piece when it is due (delay, impairment),
        in order. Reading stops while HELD pieces wait: the sender sees a full window."""
        name_os_thread(RELAY_THREAD)
        pieces: queue.Queue = queue.Queue(HELD)
        writer = threading.Thread(
            target=self._deliver, args=(pieces, src, dst, up), daemon=True, name="link-relay-out"
        )
        writer.start()
        try:
            while True:
                data = src.recv(1 << 20)
                if not data:
                    break
                data = self._cross(data, up, conn_no)
                if data is None:
                    return
                due = time.monotonic() + self.delay_s
                for at in range(0, len(data), PIECE):
                    pieces.put((due, data[at : at + PIECE]))
        except OSError:
            pass
        finally:
            pieces.put(None)

    def _deliver(self, pieces: queue.Queue, src: socket.socket, dst: socket.socket, up: bool):
        name_os_thread(RELAY_THREAD)
        sent_from = self.client_cluster if up else self.server_cluster
        try:
            while (item := pieces.get()) is not None:
                due, piece = item
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)
                self._impaired_wait(sent_from)
                dst.sendall(piece)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _impaired_wait(self, sent_from: str) -> None:
        """Hold a piece while the link is partitioned for its direction; on a lossy link, each
        loss costs a retransmission timeout."""
        rto = RTO_MIN_S
        while not self._stop.is_set():
            imp = self.link.impaired(sent_from)
            if imp is None:
                return
            left = imp.until - time.monotonic()
            if imp.loss >= 1:
                time.sleep(min(0.05, max(left, 0.0)))
                continue
            with self._rng_lock:
                lost = self._rng.random() < imp.loss
            if not lost:
                return
            time.sleep(min(rto, max(left, 0.0)))
            rto = min(2 * rto, RTO_MAX_S)

    def _cross(self, data: bytes, up: bool, conn_no: int) -> bytes | None:
        """None when a pending cut fell due (every connection of the link has been reset)."""
        with self.stats.lock:
            if not up:
                self.stats.down_bytes += len(data)
                return data
            self.stats.up_bytes += len(data)
            self.stats.per_connection_up[conn_no] += len(data)
        if self.control:  # a cut "after N bytes" counts the channels' data
            return data
        return None if self.link.crossed(len(data)) else data
