"""Channel parts that misbehave on purpose (docs/channels.md lists them), so tests can show what
the real ones do about it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import numpy as np

from pddflow.channels.deadline import Deadline
from pddflow.channels.link_relay import LinkRelay
from pddflow.channels.rdma_tensor.protocol import SharedMemoryKVParams
from pddflow.channels.rdma_tensor.sender import SharedMemoryKVSender

# (byte offset of the piece in the KV set, the piece) -> a piece to write instead, or None
WriteFault = Callable[[int, np.ndarray], "np.ndarray | None"]


class FaultyKVSender(SharedMemoryKVSender):
    def __init__(
        self,
        address: str,
        *,
        fault: WriteFault,
        params: SharedMemoryKVParams = SharedMemoryKVParams(),
    ):
        super().__init__(address, params=params)
        self._fault = fault

    def _write_piece(self, offset: int, piece: np.ndarray, place: int | None, dl: Deadline) -> None:
        bad = self._fault(offset, piece)
        super()._write_piece(offset, piece if bad is None else bad, place, dl)


class FaultyRelay(LinkRelay):
    """corrupt_marker: flip one byte of the first occurrence of the marker in the client's stream
    (once). throttle: connection number -> client->server bytes/s."""

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        corrupt_marker: bytes | None = None,
        throttle: dict[int, float] | None = None,
    ):
        self.marker = corrupt_marker
        self.throttle = dict(throttle or {})
        self.corruptions = 0
        self._corrupt_lock = threading.Lock()
        super().__init__(upstream)

    def _cross(self, data: bytes, up: bool, conn_no: int) -> bytes | None:
        if up and self.marker is not None:
            with self._corrupt_lock:
                at = data.find(self.marker) if self.corruptions == 0 else -1
                if at >= 0:
                    flipped = bytearray(data)
                    flipped[at] ^= 0xFF
                    data = bytes(flipped)
                    self.corruptions += 1
        out = super()._cross(data, up, conn_no)
        if out is not None and up and conn_no in self.throttle:
            time.sleep(len(out) / self.throttle[conn_no])
        return out


class BlackHole:
    """Accepts TCP connections and never reads or writes: the peer that hangs."""

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
                self._held.append(c)
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
