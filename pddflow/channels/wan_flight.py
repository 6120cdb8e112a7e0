"""wan_flight: KVBlocks across datacenters over Apache Arrow Flight (gRPC over TCP).

The receiver (e.g. MainDecode) runs a Flight server; the sender (Prefill) pushes with DoPut.

* A KV set is cut into runs of whole blocks (one record batch each, `codec_kv` wire form) in a
  shared queue; `streams` DoPut calls, each over its own TCP connection (a per-client gRPC
  subchannel pool), pull runs from it as fast as their connection drains, so one slow TCP stream
  takes fewer runs instead of bounding the transfer.
* After every batch the receiver writes a `KVAck` (protobuf) into the DoPut metadata stream: which
  blocks landed with a matching checksum, which were rejected. Rejected blocks are resent (at most
  `max_block_retries` times, then ChannelCorrupt); a corrupt block is never landed.
* A dropped connection is retried with backoff until the deadline; the stream asks the receiver
  (action `kv.status`) which blocks it holds and resumes after the last acknowledged one.
* Every call carries the send's deadline (gRPC deadline = time left); a peer that never answers
  makes `send` raise ChannelTimeout at the deadline. The receiver drops a partial set once the
  sender's deadline (sent in the descriptor) has passed.
* TLS (`grpc+tls://`), bearer-token middleware (missing or wrong token: ChannelAuthError), gRPC
  keepalive and message size limits (gRPC options on the client; the Flight server, which
  pyarrow does not let us configure, checks every batch against the same limit itself).
* Optional link emulation (`emulate=LinkModel`, sender side): each stream's batches are held to
  the emulated link's token bucket and one-way delay, and completion waits for the final
  acknowledgement's return delay.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from pddflow.channels.codec_kv import BatchBlocks, KVSource
from pddflow.channels.deadline import Deadline
from pddflow.channels.emulation import EmulatedLink
from pddflow.channels.errors import (
    ChannelAuthError,
    ChannelCancelled,
    ChannelClosed,
    ChannelCorrupt,
    ChannelError,
    ChannelTimeout,
)
from pddflow.channels.inbox import Inbox
from pddflow.channels.kv_checksum import check_algorithm
from pddflow.channels.kv_landing import KVLanding, bitmap_indices
from pddflow.channels.kv_layout import KVLayout
from pddflow.channels.proto import pddflow_pb2 as pb
from pddflow.channels.security import AUTH_HEADER, TLSConfig, bearer, check_bearer
from pddflow.channels.transfer import TransferReport
from pddflow.core.link import LinkModel, kv_link_seed
from pddflow.core.payloads import KVBlocks

Alloc = Callable[[str, int, KVLayout], Any]

_RETRYABLE = (fl.FlightUnavailableError, fl.FlightInternalError, pa.ArrowIOError, OSError)


@dataclass(frozen=True)
class WanFlightParams:
    """Channel params a graph edge passes (`channel: wan_flight`)."""

    streams: int = 4
    deadline_s: float = 30.0  # default time allowed per send / recv
    token: str | None = None
    tls: TLSConfig | None = None
    max_batch_bytes: int = 8 << 20  # one record batch (a run of whole blocks)
    max_message_bytes: int = 64 << 20  # gRPC message limit, both sides
    keepalive_s: float = 30.0
    emulate: LinkModel | None = None
    seed: int = 0
    checksum: str = "xsum64"  # per-block checksum: xsum64 (fast) or crc32 (codec_kv.py)
    # receiver: let glibc recycle gRPC's freed receive buffers (see below)
    tune_host_malloc: bool = True

    def __post_init__(self) -> None:
        check_algorithm(self.checksum)
        if self.streams < 1:
            raise ValueError("wan_flight streams must be >= 1")


# ============================================================================== receiver (server)


class _Inbound:
    def __init__(self, hdr: Any, landing: KVLanding, expires_at: float):
        self.transfer_id = hdr.transfer_id
        self.seq_id = hdr.seq_id
        self.num_blocks = hdr.num_blocks
        self.landing: KVLanding | None = landing
        self.expires_at = expires_at
        self.done = False
        self.cancelled: str | None = None

    def status(self) -> Any:
        if self.landing is not None:
            return pb.KVStatus(
                transfer_id=self.transfer_id,
                received=self.landing.bitmap(),
                known=True,
                received_total=self.landing.count,
                complete=self.done,
                cancelled=self.cancelled is not None,
                reason=self.cancelled or "",
            )
        full = (
            np.packbits(np.ones(self.num_blocks, dtype=bool), bitorder="little").tobytes()
            if self.done
            else b""
        )
        return pb.KVStatus(
            transfer_id=self.transfer_id,
            received=full,
            known=True,
            complete=self.done,
            received_total=self.num_blocks if self.done else 0,
            cancelled=self.cancelled is not None,
            reason=self.cancelled or "",
        )


class _AuthFactory(fl.ServerMiddlewareFactory):
    def __init__(self, token: str):
        super().__init__()
        self.token = token

    def start_call(self, info: Any, headers: dict) -> None:
        refusal = check_bearer(headers.get(AUTH_HEADER), self.token, "wan_flight")
        if refusal:
            raise fl.FlightUnauthenticatedError(refusal)
        return None


class _Server(fl.FlightServerBase):
    def __init__(
        self, owner: WanFlightReceiver, location: str, tls: TLSConfig | None, token: str | None
    ):
        kwargs: dict[str, Any] = {}
        if tls is not None:
            cert, key = tls.server_pair()
            kwargs["tls_certificates"] = [fl.CertKeyPair(cert=cert, key=key)]
        if token:
            kwargs["middleware"] = {"auth": _AuthFactory(token)}
        super().__init__(location, **kwargs)
        self.owner = owner

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        self.owner._serve_put(descriptor, reader, writer)

    def do_action(self, context: Any, action: Any) -> Any:
        return self.owner._serve_action(action)

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [
            ("ping", "liveness and auth check"),
            ("kv.status", "blocks held for a transfer (KVStatus)"),
            ("kv.cancel", "drop a transfer or a sequence (KVCancel)"),
        ]


class WanFlightReceiver:
    """Flight server that lands KV sets and hands them out per sequence.

    `recv(seq_id=None, timeout_s=...)` returns the next completed KVBlocks (or the one for
    seq_id). `alloc(seq_id, num_blocks, layout)` may return the destination tensor (e.g. pages of
    a KV cache staging area); by default a new tensor of the sender's kind is allocated.
    Thread-safe; the Flight server runs on its own threads from construction until close().
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        params: WanFlightParams = WanFlightParams(),
        alloc: Alloc | None = None,
        tensor_lib: str | None = None,
    ):
        self.params = params
        self._alloc = alloc
        self._tensor_lib = tensor_lib
        if params.tune_host_malloc:
            # gRPC allocates each message's receive buffers with malloc and frees them once the batch
            # has landed; with glibc's default thresholds those MBs go back to the kernel and every
            # batch page-faults them in again (a third of the receiver's CPU here). Process-wide.
            from pddflow.core.host_memory import keep_freed_memory

            keep_freed_memory()
        self._lock = threading.Lock()
        self._create_lock = threading.Lock()
        self._inbound: dict[str, _Inbound] = {}
        self._inbox = Inbox("wan_flight")
        self._closed = False
        scheme = "grpc+tls" if params.tls is not None else "grpc"
        self._server = _Server(self, f"{scheme}://{host}:{port}", params.tls, params.token)
        self.host = host
        self.port = self._server.port
        self.location = f"{scheme}://{host}:{self.port}"
        self.address = self.location  # what a sender connects to (same name on every channel kind)

    # ------------------------------------------------------------------ runtime API

    def recv(
        self,
        seq_id: str | None = None,
        timeout_s: float | None = None,
        deadline: float | None = None,
    ) -> KVBlocks:
        dl = Deadline.of(
            timeout_s if timeout_s is not None or deadline is not None else self.params.deadline_s,
            deadline,
            what=f"wan_flight recv{'(' + seq_id + ')' if seq_id else ''}",
        )
        with self._lock:
            self._sweep_locked()
        return self._inbox.get(seq_id, dl)

    def cancel(self, seq_id: str, reason: str = "cancelled by receiver") -> None:
        """Drop every partial transfer of seq_id, free its memory and refuse further blocks for it."""
        self._inbox.cancel(seq_id, reason)
        with self._lock:
            self._drop_seq_locked(seq_id, reason)

    def pending(self) -> dict[str, int]:
        """transfer_id -> blocks landed, for transfers still in progress."""
        with self._lock:
            return {
                t: i.landing.count
                for t, i in self._inbound.items()
                if i.landing is not None and not i.done
            }

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._inbound.clear()
        self._inbox.close()
        self._server.shutdown()

    def __enter__(self) -> WanFlightReceiver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ server internals

    def _drop_seq_locked(self, seq_id: str, reason: str) -> None:
        for inb in self._inbound.values():
            if inb.seq_id == seq_id and not inb.done:
                inb.cancelled = reason
                inb.landing = None  # frees the partial KV

    def _sweep_locked(self) -> None:
        now = time.monotonic()
        for tid in [t for t, i in self._inbound.items() if i.expires_at < now]:
            del self._inbound[tid]

    def _get_inbound(self, hdr: Any) -> _Inbound:
        with self._create_lock:  # one allocation per transfer, however many streams arrive at once
            with self._lock:
                if self._closed:
                    raise fl.FlightUnavailableError("wan_flight receiver is closing")
                self._sweep_locked()
                reason = self._inbox.cancelled_reason(hdr.seq_id)
                if reason is not None:
                    raise fl.FlightCancelledError(
                        f"wan_flight: {hdr.seq_id!r} cancelled by receiver: {reason}"
                    )
                inb = self._inbound.get(hdr.transfer_id)
                if inb is not None:
                    inb.expires_at = max(inb.expires_at, time.monotonic() + hdr.timeout_s + 5.0)
                    return inb
            layout = KVLayout.from_proto(hdr.layout)
            dest = self._alloc(hdr.seq_id, hdr.num_blocks, layout) if self._alloc else None
            landing = KVLanding(
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
            with self._lock:
                inb = self._inbound[hdr.transfer_id] = _Inbound(
                    hdr, landing, time.monotonic() + hdr.timeout_s + 5.0
                )
                return inb

    def _serve_put(self, descriptor: Any, reader: Any, writer: Any) -> None:
        try:
            hdr = pb.KVTransfer.FromString(descriptor.command)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the client's error
            raise fl.FlightServerError(f"wan_flight: bad transfer descriptor: {exc}") from None
        inb = self._get_inbound(hdr)
        bb = KVLayout.from_proto(hdr.layout).block_bytes
        limit = self.params.max_message_bytes
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            batch = chunk.data
            if batch is None:
                continue
            if batch.nbytes > limit:
                raise fl.FlightServerError(
                    f"wan_flight: batch of {batch.nbytes} bytes exceeds the receiver's "
                    f"message limit of {limit} bytes"
                )
            if inb.cancelled is not None or inb.landing is None:
                if inb.done:
                    accepted, rejected = BatchBlocks.of(batch, bb).index.tolist(), []
                else:
                    raise fl.FlightCancelledError(
                        f"wan_flight: {inb.seq_id!r} cancelled by receiver: {inb.cancelled}"
                    )
            else:
                landing = inb.landing
                accepted, rejected = landing.land(BatchBlocks.of(batch, bb))
                if landing.complete:
                    self._complete(inb)
            ack = pb.KVAck(
                accepted=accepted,
                rejected=rejected,
                complete=inb.done,
                received_total=inb.num_blocks
                if inb.done
                else (inb.landing.count if inb.landing else 0),
            )
            writer.write(pa.py_buffer(ack.SerializeToString()))
        if inb.landing is not None and inb.landing.complete:  # an empty set completes on contact
            self._complete(inb)

    def _complete(self, inb: _Inbound) -> None:
        with self._lock:
            if inb.done or inb.landing is None:
                return
            inb.done = True
            result = inb.landing.result()
            inb.landing = None
            inb.expires_at = time.monotonic() + 60.0  # answer late status queries with "complete"
        self._inbox.put(result)

    def _serve_action(self, action: Any) -> list[bytes]:
        kind, body = action.type, action.body.to_pybytes() if action.body is not None else b""
        if kind == "ping":
            return [b"pong"]
        if kind == "kv.status":
            req = pb.KVStatus.FromString(body)
            with self._lock:
                inb = self._inbound.get(req.transfer_id)
                st = inb.status() if inb else pb.KVStatus(transfer_id=req.transfer_id, known=False)
            return [st.SerializeToString()]
        if kind == "kv.cancel":
            req = pb.KVCancel.FromString(body)
            reason = req.reason or "cancelled by sender"
            if req.seq_id:
                self._inbox.cancel(req.seq_id, reason)
            with self._lock:
                if req.seq_id:
                    self._drop_seq_locked(req.seq_id, reason)
                inb = self._inbound.get(req.transfer_id)
                if inb is not None and not inb.done:
                    inb.cancelled = reason
                    inb.landing = None
            return [b"ok"]
        raise fl.FlightServerError(
            f"wan_flight: unknown action {kind!r}; valid: ping, kv.status, kv.cancel"
        )


# ================================================================================ sender (client)


class _Job:
    """One send: a shared queue of block runs that every stream pulls from (so a slow stream
    simply takes fewer runs), and which blocks the receiver has acknowledged."""

    def __init__(self, src: KVSource, transfer_id: str, deadline: Deadline, max_batch_bytes: int):
        self.src, self.transfer_id, self.deadline = src, transfer_id, deadline
        n = src.kv.num_blocks
        per = max(1, max_batch_bytes // max(1, src.layout.block_bytes))
        self._queue: deque[tuple[int, int]] = deque(
            (lo, min(n, lo + per)) for lo in range(0, n, per)
        )
        self._acked = np.zeros(n, dtype=bool)
        self._count = 0
        self._rejections: dict[int, int] = {}
        self.cond = threading.Condition()
        self.abort = threading.Event()
        self.resent = 0
        self.reconnects = 0

    @property
    def complete(self) -> bool:
        with self.cond:
            return self._count == self.src.kv.num_blocks

    def take(self) -> tuple[int, int] | None:
        """The next run with blocks not yet acknowledged, trimmed to its first missing sub-run."""
        with self.cond:
            while self._queue:
                lo, hi = self._queue.popleft()
                missing = np.flatnonzero(~self._acked[lo:hi])
                if missing.size == 0:
                    continue
                a = lo + int(missing[0])
                b = a
                while b < hi and not self._acked[b]:
                    b += 1
                if b < hi:
                    self._queue.appendleft((b, hi))
                return a, b
            return None

    def give_back(self, runs: list[tuple[int, int]]) -> None:
        with self.cond:
            self._queue.extendleft(reversed(runs))
            self.cond.notify_all()

    def acked(self, blocks: list[int] | np.ndarray) -> None:
        with self.cond:
            for b in blocks:
                if not self._acked[b]:
                    self._acked[b] = True
                    self._count += 1
            self.cond.notify_all()

    def rejected(self, blocks: list[int], max_retries: int) -> None:
        with self.cond:
            for b in blocks:
                self._rejections[b] = self._rejections.get(b, 0) + 1
                if self._rejections[b] > max_retries:
                    raise ChannelCorrupt(
                        f"{self.deadline.what}: block {b} failed its {self.src.checksum} checksum "
                        f"at the receiver {self._rejections[b]} times",
                        [b],
                    )
            self.resent += len(blocks)
            self._queue.extend((b, b + 1) for b in blocks)
            self.cond.notify_all()

    def wait_for_work(self) -> None:
        """Idle stream: wait until there is work again or the set is complete (others' acks)."""
        with self.cond:
            if not self._queue and self._count < self.src.kv.num_blocks and not self.abort.is_set():
                self.cond.wait(min(0.05, self.deadline.remaining()))


class WanFlightSender:
    """Pushes KVBlocks to one WanFlightReceiver. Thread-safe; several sends may run at once.

    `send(kv, timeout_s=...)` blocks until every block is acknowledged (returns a TransferReport)
    or raises ChannelTimeout / ChannelAuthError / ChannelCorrupt / ChannelCancelled.
    `send_async` returns a concurrent.futures.Future of the same.
    """

    def __init__(
        self,
        location: str,
        *,
        params: WanFlightParams = WanFlightParams(),
        max_block_retries: int = 3,
        ack_window: int = 8,
        max_inflight_sends: int = 4,
    ):
        self.location = location
        self.params = params
        self.max_block_retries = max_block_retries
        self.ack_window = max(1, ack_window)
        self._clients: dict[int, fl.FlightClient] = {}
        self._clients_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(
            max_workers=params.streams * max_inflight_sends, thread_name_prefix="wan_flight"
        )
        self._outer = ThreadPoolExecutor(
            max_workers=max_inflight_sends, thread_name_prefix="wan_flight_send"
        )
        self._jobs: dict[str, _Job] = {}
        self._link = (
            EmulatedLink(params.emulate, seed=kv_link_seed(params.seed)) if params.emulate else None
        )
        self._calls: dict[int, int] = {}
        self._lane_lock = threading.Lock()
        self._headers = (
            [(AUTH_HEADER.encode(), bearer(params.token).encode())] if params.token else []
        )
        self._roots = (
            params.tls.roots() if params.tls is not None and params.tls.root_certs else None
        )
        self._closed = False

    # ------------------------------------------------------------------ runtime API

    def send(
        self,
        kv: KVBlocks | KVSource,
        *,
        timeout_s: float | None = None,
        deadline: float | None = None,
        transfer_id: str | None = None,
    ) -> TransferReport:
        if self._closed:
            raise ChannelClosed("wan_flight sender closed")
        src = kv if isinstance(kv, KVSource) else KVSource.of(kv, self.params.checksum)
        dl = Deadline.of(
            timeout_s if timeout_s is not None or deadline is not None else self.params.deadline_s,
            deadline,
            what=f"wan_flight send {src.kv.seq_id!r} to {self.location}",
        )
        if src.layout.block_bytes + (1 << 16) > self.params.max_message_bytes:
            raise ChannelError(
                f"one KV block is {src.layout.block_bytes} bytes, over the message limit "
                f"{self.params.max_message_bytes}; raise max_message_bytes"
            )
        job = _Job(src, transfer_id or uuid.uuid4().hex, dl, self.params.max_batch_bytes)
        self._jobs[job.transfer_id] = job
        t0 = time.perf_counter()
        try:
            n = src.kv.num_blocks
            k = min(
                self.params.streams,
                max(1, -(-n * src.layout.block_bytes // self.params.max_batch_bytes)),
            )
            futs = [self._pool.submit(self._run_stream, job, s, k) for s in range(k)]
            error: BaseException | None = None
            for f in futs:
                try:
                    f.result()
                except BaseException as exc:  # noqa: BLE001 - first error wins, the others stop
                    job.abort.set()
                    error = error or exc
            if error is None and job.abort.is_set():
                error = ChannelCancelled(f"{dl.what}: cancelled by sender")
            if error is not None:
                if not isinstance(error, (ChannelAuthError,)):
                    self._cancel_remote_async(
                        job.transfer_id, src.kv.seq_id, f"sender failed: {error}"
                    )
                raise error
            return TransferReport(
                job.transfer_id,
                src.kv.seq_id,
                n,
                n * src.layout.block_bytes,
                time.perf_counter() - t0,
                job.resent,
                job.reconnects,
            )
        finally:
            self._jobs.pop(job.transfer_id, None)

    def send_async(self, kv: KVBlocks | KVSource, **kw: Any) -> Future[TransferReport]:
        return self._outer.submit(self.send, kv, **kw)

    def cancel(
        self, seq_id: str, reason: str = "cancelled by sender", timeout_s: float = 2.0
    ) -> None:
        """Stop local sends of seq_id and tell the receiver to drop its partial KV (best effort
        within timeout_s; a ChannelTimeout here means the receiver did not hear it)."""
        for job in list(self._jobs.values()):
            if job.src.kv.seq_id == seq_id:
                job.abort.set()
        dl = Deadline.of(timeout_s, what=f"wan_flight cancel {seq_id!r}")
        self._action(
            0, "kv.cancel", pb.KVCancel(seq_id=seq_id, reason=reason).SerializeToString(), dl
        )

    def connect(self, timeout_s: float = 5.0) -> None:
        """Open every stream's connection now (and check credentials), so the first send does not
        pay for connection setup."""
        dl = Deadline.of(timeout_s, what=f"wan_flight connect {self.location}")
        futs = [
            self._pool.submit(self.ping, dl.remaining(), stream)
            for stream in range(self.params.streams)
        ]
        for f in futs:
            f.result()

    def ping(self, timeout_s: float = 5.0, stream: int = 0) -> None:
        """Check the receiver is reachable and accepts our credentials (on one stream's connection)."""
        dl = Deadline.of(timeout_s, what=f"wan_flight ping {self.location}")
        last: BaseException | None = None
        while True:
            try:
                self._action(stream, "ping", b"", dl)
                return
            except ChannelError:
                raise
            except _RETRYABLE as exc:
                last = exc
                self._reset(stream)
                if dl.remaining() <= 0.05:
                    raise ChannelTimeout(
                        f"{dl.what}: deadline passed; last error: {_msg(last)}"
                    ) from None
                time.sleep(min(0.05, dl.remaining()))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for job in list(self._jobs.values()):
            job.abort.set()
        self._outer.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._clients_lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    def __enter__(self) -> WanFlightSender:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _client(self, stream: int) -> fl.FlightClient:
        with self._clients_lock:
            c = self._clients.get(stream)
            if c is None:
                p = self.params
                opts = [
                    ("grpc.use_local_subchannel_pool", 1),  # one TCP connection per stream
                    ("grpc.max_send_message_length", p.max_message_bytes),
                    ("grpc.max_receive_message_length", p.max_message_bytes),
                    ("grpc.keepalive_time_ms", int(p.keepalive_s * 1000)),
                    ("grpc.keepalive_timeout_ms", 10_000),
                    ("grpc.keepalive_permit_without_calls", 0),
                    ("grpc.http2.max_pings_without_data", 0),
                    ("grpc.initial_reconnect_backoff_ms", 50),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ]
                kw: dict[str, Any] = {
                    "generic_options": opts,
                    "write_size_limit_bytes": p.max_message_bytes,
                }
                if self._roots is not None:
                    kw["tls_root_certs"] = self._roots
                c = self._clients[stream] = fl.FlightClient(self.location, **kw)
            return c

    def _reset(self, stream: int) -> None:
        with self._clients_lock:
            c = self._clients.pop(stream, None)
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - a broken client may fail to close; it is dropped anyway
                pass

    def _options(self, dl: Deadline) -> fl.FlightCallOptions:
        left = dl.remaining()
        if left <= 0:
            raise dl.timeout()
        return fl.FlightCallOptions(timeout=left, headers=self._headers)

    def _action(self, stream: int, kind: str, body: bytes, dl: Deadline) -> list[bytes]:
        try:
            results = self._client(stream).do_action(
                fl.Action(kind, body), options=self._options(dl)
            )
            return [r.body.to_pybytes() for r in results]
        except BaseException as exc:
            raise _translate(exc, dl, self.location) from None

    def _cancel_remote_async(self, transfer_id: str, seq_id: str, reason: str) -> None:
        def run() -> None:
            try:
                self._action(
                    0,
                    "kv.cancel",
                    pb.KVCancel(transfer_id=transfer_id, reason=reason[:500]).SerializeToString(),
                    Deadline.of(1.0),
                )
            except Exception:  # noqa: BLE001 - best effort; the receiver also expires the transfer
                pass

        threading.Thread(target=run, daemon=True, name="wan_flight_cancel").start()

    def _header(self, job: _Job, stream: int, num_streams: int) -> bytes:
        kv = job.src.kv
        return pb.KVTransfer(
            transfer_id=job.transfer_id,
            seq_id=kv.seq_id,
            num_blocks=kv.num_blocks,
            token_start=kv.token_start,
            token_end=kv.token_end,
            block_size=kv.block_size,
            layout=job.src.layout.to_proto(pb),
            stream=stream,
            num_streams=num_streams,
            timeout_s=job.deadline.remaining(),
            hashes_signed=job.src.hashes_signed,
            checksum=job.src.checksum,
        ).SerializeToString()

    def _run_stream(self, job: _Job, stream: int, num_streams: int) -> None:
        """Pull runs from the job and push them on this stream's connection until every block is
        acknowledged; on a dropped connection, reconnect and resume from what the receiver holds."""
        resume = False
        backoff = 0.05
        last: BaseException | None = None
        first = True
        while first or not job.complete:
            if job.abort.is_set():
                return
            try:
                job.deadline.check(f"sending stream {stream}")
            except ChannelTimeout as exc:
                raise ChannelTimeout(
                    f"{exc}; last error: {_msg(last)}" if last else str(exc)
                ) from None
            try:
                if resume:
                    st = pb.KVStatus.FromString(
                        self._action(
                            stream,
                            "kv.status",
                            pb.KVStatus(transfer_id=job.transfer_id).SerializeToString(),
                            job.deadline,
                        )[0]
                    )
                    if st.cancelled:
                        raise ChannelCancelled(
                            f"{job.deadline.what}: receiver cancelled it: {st.reason}"
                        )
                    if st.known:
                        job.acked(bitmap_indices(st.received, job.src.kv.num_blocks))
                    resume = False
                    continue
                sent = self._put(
                    job, stream, num_streams, always=first and job.src.kv.num_blocks == 0
                )
                first = False
                backoff = 0.05
                if not sent:
                    job.wait_for_work()
            except ChannelError:  # already classified (auth, timeout, cancel, corrupt): not retried
                raise
            except _RETRYABLE as exc:
                if isinstance(exc, fl.FlightError) and not isinstance(
                    exc, (fl.FlightUnavailableError, fl.FlightInternalError)
                ):
                    raise _translate(exc, job.deadline, self.location) from None
                last = exc
                resume = True
                with job.cond:
                    job.reconnects += 1
                self._reset(stream)
                time.sleep(min(backoff, job.deadline.remaining()))
                backoff = min(backoff * 2, 1.0)
        if self._link is not None and stream == 0:  # the final acknowledgement crossing back
            self._link.wait_until(
                time.monotonic() + self._link.return_delay(stream),
                job.deadline,
                "the final acknowledgement",
            )

    def _put(self, job: _Job, stream: int, num_streams: int, always: bool) -> int:
        """One DoPut carrying runs pulled from the job; returns how many runs it sent. Runs not
        acknowledged when the call fails go back to the job for any stream to resend."""
        src, dl = job.src, job.deadline
        run = job.take()
        if run is None and not always:
            return 0
        client = self._client(stream)
        descriptor = fl.FlightDescriptor.for_command(self._header(job, stream, num_streams))
        try:
            writer, reader = client.do_put(descriptor, src.schema(), options=self._options(dl))
        except BaseException as exc:
            if run is not None:
                job.give_back([run])
            raise _translate(exc, dl, self.location) from None
        inflight: deque[tuple[int, int]] = deque()
        sent = 0
        ready: float | None = None
        schema = src.schema()
        lane = self._lane(
            stream
        )  # this call's messages stay in order; other calls interleave (delays
        # are still drawn from the stream's own random sequence, as before calls had lanes)
        try:
            while run is not None:
                if job.abort.is_set():
                    break
                batch = src.batch(run[0], run[1], schema)
                if self._link is not None:
                    ready = self._link.hold(
                        batch.nbytes, lane=lane, deadline=dl, ready_at=ready, jitter_lane=stream
                    )
                writer.write_batch(batch)
                inflight.append(run)
                sent += 1
                while len(inflight) >= self.ack_window:
                    self._take_ack(job, inflight, reader, dl)
                run = job.take()
            writer.done_writing()
            while inflight:
                self._take_ack(job, inflight, reader, dl)
            writer.close()
        except BaseException as exc:
            job.give_back(
                list(inflight) + ([run] if run is not None and run not in inflight else [])
            )
            cause: BaseException = exc
            try:
                writer.close()  # releases the call and yields the receiver's final status
            except BaseException as status:  # noqa: BLE001
                if isinstance(exc, _AcksEnded):
                    cause = status  # the acks stopped because the receiver failed the call: say why
            if isinstance(cause, _AcksEnded):
                cause = fl.FlightInternalError(
                    str(cause)
                )  # no status either: treat as a dropped stream
            raise _translate(cause, dl, self.location) from None
        finally:
            if self._link is not None:
                self._link.end_lane(lane)
        return sent

    def _lane(self, stream: int) -> str:
        """An emulation lane per DoPut call: `stream.call`, numbered per stream so a run repeats."""
        with self._lane_lock:
            self._calls[stream] = self._calls.get(stream, 0) + 1
            return f"{stream}.{self._calls[stream]}"

    def _take_ack(self, job: _Job, inflight: deque, reader: Any, dl: Deadline) -> None:
        buf = reader.read()
        if buf is None:
            raise _AcksEnded("wan_flight: ack stream ended early")
        ack = pb.KVAck.FromString(buf.to_pybytes())
        inflight.popleft()
        job.acked(list(ack.accepted))
        if ack.rejected:
            job.rejected(list(ack.rejected), self.max_block_retries)


class _AcksEnded(Exception):
    """The receiver's ack stream ended before every batch was acknowledged."""


def _msg(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    for cut in (". Detail:", ". gRPC client debug context"):  # gRPC appends its debug dump
        first = first.split(cut)[0]
    return first[:300]


def _translate(exc: BaseException, dl: Deadline, location: str) -> BaseException:
    """Map Flight errors onto channel errors; retryable transport errors pass through unchanged."""
    if isinstance(exc, ChannelError):
        return exc
    if isinstance(exc, (fl.FlightUnauthenticatedError, fl.FlightUnauthorizedError)):
        return ChannelAuthError(
            f"wan_flight receiver at {location} refused our credentials: {_msg(exc)}"
        )
    if isinstance(exc, fl.FlightTimedOutError) or (dl.expired() and isinstance(exc, _RETRYABLE)):
        return ChannelTimeout(f"{dl.what}: deadline passed ({_msg(exc)})")
    if isinstance(exc, fl.FlightCancelledError):
        return ChannelCancelled(f"{dl.what}: {_msg(exc)}")
    if isinstance(exc, (fl.FlightUnavailableError, fl.FlightInternalError)):
        return exc
    if isinstance(exc, fl.FlightServerError):
        return ChannelError(f"{dl.what}: receiver error: {_msg(exc)}")
    return exc
