"""Receiver peers in their own OS process, for the channel tests and `pddflow bench channels`.

    python -m pddflow.testing.peer wan-recv  [--token T] [--tls-cert C --tls-key K]
                                             [--reuse-dest] [--no-digest]
    python -m pddflow.testing.peer rdma-recv [--ring-slots N] [--slot-mb M] [--arena-mb A]
                                             [--reuse-dest] [--no-digest] [--token T]
                                             [--transport tcp --address tcp:127.0.0.1:0]
    python -m pddflow.testing.peer tok-server [--token T] [--tls-cert C --tls-key K] [--quiet]
    python -m pddflow.testing.peer tcp-recv  --nbytes N

Each prints `{"ready": ..., "address": ...}`, then one JSON line (a digest, never the data) per
set or message received, and exits when its stdin closes, so a dying parent takes it along."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

from pddflow.core.child_python import python_module


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def kv_digest(kv: Any) -> dict:
    """What a test compares on both sides: bytes, hashes, token range, dtype, shape."""
    from pddflow.channels.kv_layout import block_rows

    rows = block_rows(kv.data)
    return {
        "seq_id": kv.seq_id,
        "num_blocks": kv.num_blocks,
        "token_start": kv.token_start,
        "token_end": kv.token_end,
        "block_size": kv.block_size,
        "hashes": [str(h) for h in kv.block_hashes],
        "dtype": str(kv.data.dtype).removeprefix("torch."),
        "shape": list(kv.data.shape),
        "sha256": hashlib.sha256(rows).hexdigest(),
    }


class _ReusedDest:
    """alloc() that hands out one warm buffer again and again (a preallocated KV cache)."""

    def __init__(self) -> None:
        self.buf: Any = None

    def __call__(self, seq_id: str, num_blocks: int, layout: Any) -> Any:
        if (
            self.buf is None
            or self.buf.shape[0] < num_blocks
            or tuple(self.buf.shape[1:]) != layout.block_shape
        ):
            self.buf = layout.empty(num_blocks)
            from pddflow.channels.kv_layout import block_rows

            block_rows(self.buf).fill(0)  # touch every page now, like a cache allocated at startup
        return self.buf[:num_blocks]


def _tls(args: argparse.Namespace) -> Any:
    from pddflow.channels.security import TLSConfig

    return TLSConfig(cert_chain=args.tls_cert, private_key=args.tls_key) if args.tls_cert else None


def _stdin_closed() -> threading.Event:
    ev = threading.Event()

    def watch() -> None:
        try:
            while sys.stdin.buffer.read(1):
                pass
        finally:
            ev.set()

    threading.Thread(target=watch, daemon=True).start()
    return ev


def _serve_kv(rx: Any, args: argparse.Namespace, stop: threading.Event) -> None:
    from pddflow.channels.errors import ChannelTimeout

    while not stop.is_set():
        try:
            kv = rx.recv(timeout_s=0.2)
        except ChannelTimeout:
            continue
        out = {"seq_id": kv.seq_id, "num_blocks": kv.num_blocks, "t": time.monotonic()}
        if not args.no_digest:
            out = {**kv_digest(kv), "t": out["t"]}
        del kv  # an arena-backed set returns its memory now
        _emit({"kv": out})


def _serve_receiver(rx: Any, address: str, args: argparse.Namespace, stop: threading.Event) -> None:
    """Announce a KV receiver's address, serve it until stdin closes, close it."""
    _emit({"ready": True, "address": address, "pid": os.getpid()})
    try:
        _serve_kv(rx, args, stop)
    finally:
        rx.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pddflow.testing.peer")
    ap.add_argument("role", choices=["wan-recv", "rdma-recv", "tok-server", "tcp-recv"])
    ap.add_argument("--token")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--reuse-dest", action="store_true")
    ap.add_argument("--no-digest", action="store_true")
    ap.add_argument("--ring-slots", type=int, default=4)
    ap.add_argument("--slot-mb", type=float, default=2.0)
    ap.add_argument("--arena-mb", type=float, default=512.0)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--nbytes", type=int, default=0)
    ap.add_argument("--transport", default="auto", help="rdma-recv: auto, shm, tcp or nixl")
    ap.add_argument("--address", help="rdma-recv: e.g. tcp:127.0.0.1:0 (default: unix:@...)")
    args = ap.parse_args(argv)
    stop = _stdin_closed()

    if args.role == "wan-recv":
        from pddflow.channels.wan_flight.params import WanFlightParams
        from pddflow.channels.wan_flight.receiver import WanFlightReceiver

        rx = WanFlightReceiver(
            params=WanFlightParams(token=args.token, tls=_tls(args)),
            alloc=_ReusedDest() if args.reuse_dest else None,
        )
        _serve_receiver(rx, rx.location, args, stop)
    elif args.role == "rdma-recv":
        from pddflow.channels.rdma_tensor.protocol import SharedMemoryKVParams
        from pddflow.channels.rdma_tensor.receiver import SharedMemoryKVReceiver

        params = SharedMemoryKVParams(
            ring_slots=args.ring_slots,
            slot_mb=args.slot_mb,
            arena_mb=args.arena_mb,
            transport=args.transport,
            token=args.token,
        )
        rx = SharedMemoryKVReceiver(
            args.address, params=params, alloc=_ReusedDest() if args.reuse_dest else None
        )
        _serve_receiver(rx, rx.address, args, stop)
    elif args.role == "tok-server":
        from pddflow.channels.errors import ChannelTimeout
        from pddflow.channels.token_ids.codec import Control
        from pddflow.channels.token_ids.protocol import TokenIdsParams
        from pddflow.channels.token_ids.server import TokenIdsServer

        srv = TokenIdsServer(
            params=TokenIdsParams(token=args.token, tls=_tls(args)), name="peer-server"
        )
        _emit({"ready": True, "address": srv.address, "pid": os.getpid()})
        try:
            while not stop.is_set():
                try:
                    m = srv.recv(timeout_s=0.2)
                except ChannelTimeout:
                    continue
                if args.quiet:
                    continue
                p = m.payload
                if isinstance(p, Control):
                    _emit(
                        {
                            "control": {
                                "peer": m.peer,
                                "kind": str(p.kind),
                                "seq_id": p.seq_id,
                                "reason": p.reason,
                            }
                        }
                    )
                else:
                    _emit(
                        {
                            "tokens": {
                                "peer": m.peer,
                                "seq_id": p.seq_id,
                                "start": p.start,
                                "ids": p.ids,
                                "final": p.final,
                            }
                        }
                    )
        finally:
            srv.close()
    elif args.role == "tcp-recv":
        _tcp_recv(args.nbytes, stop)
    return 0


def _tcp_recv(nbytes: int, stop: threading.Event) -> None:
    """Plain TCP baseline: receive nbytes into a warm buffer, answer one byte, repeat."""
    srv = socket.create_server(("127.0.0.1", 0))
    _emit({"ready": True, "address": f"127.0.0.1:{srv.getsockname()[1]}", "pid": os.getpid()})
    srv.settimeout(0.2)
    buf = np.zeros(nbytes, dtype=np.uint8)
    mv = memoryview(buf)
    while not stop.is_set():
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(60)
            try:
                while True:
                    got = 0
                    while got < nbytes:
                        n = conn.recv_into(mv[got:], min(nbytes - got, 4 << 20))
                        if n == 0:
                            raise ConnectionError
                        got += n
                    conn.sendall(b"k")
            except (ConnectionError, OSError):
                continue
    srv.close()


class PeerProcess:
    """Start a peer (`python -m pddflow.testing.peer ROLE ...`) and read its JSON lines."""

    def __init__(self, role: str, *args: str, ready_timeout_s: float = 60.0):
        cmd = [*python_module("pddflow.testing.peer"), role, *args]
        # a file, not a pipe: a chatty child never blocks on it
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err
        )
        self._buf = b""
        try:
            ready = self.line(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        if not ready.get("ready"):
            self.stop()
            raise RuntimeError(f"peer {role} did not start: {ready}")
        self.address: str = ready["address"]
        self.pid: int = ready["pid"]

    def line(self, timeout_s: float) -> dict:
        end = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"peer {self.proc.args[3]} sent nothing within {timeout_s}s")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"peer {self.proc.args[3]} exited: {self.stderr()[-3000:]}")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\n", 1)
        return json.loads(raw)

    def stderr(self) -> str:
        self._err.seek(0)
        return self._err.read().decode(errors="replace")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for f in (self.proc.stdout, self.proc.stdin, self._err):
            try:
                if f:
                    f.close()
            except OSError:
                pass

    def __enter__(self) -> PeerProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


if __name__ == "__main__":
    raise SystemExit(main())
