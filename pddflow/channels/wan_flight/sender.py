"""The sending end of a wan_flight channel: pushes KV sets to a receiver over several DoPut
streams and resumes them after a dropped connection (protocol: docs/channels.md)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow.flight as fl

from pddflow.channels.codec_kv import KVSource
from pddflow.channels.deadline import Deadline
from pddflow.channels.emulation import EmulatedLink
from pddflow.channels.errors import (
    ChannelAuthError,
    ChannelCancelled,
    ChannelClosed,
    ChannelError,
    ChannelTimeout,
)
from pddflow.channels.first_token import first_to_pb
from pddflow.channels.kv_landing import bitmap_indices
from pddflow.channels.proto import pddflow_pb2 as pb
from pddflow.channels.security import AUTH_HEADER, bearer
from pddflow.channels.transfer import TransferReport
from pddflow.channels.wan_flight.errors import RETRYABLE, AcksEnded, first_line, translate
from pddflow.channels.wan_flight.params import WanFlightParams
from pddflow.channels.wan_flight.send_job import SendJob
from pddflow.core.link import kv_link_seed
from pddflow.core.payloads import KVBlocks


class WanFlightSender:
    """Pushes KVBlocks to one WanFlightReceiver. Thread-safe; several sends may run at once."""

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
        self._jobs: dict[str, SendJob] = {}
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

    @property
    def emulated_link(self) -> EmulatedLink | None:
        """What shapes this end's sends (None: not emulated): a link degrade retunes it."""
        return self._link

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
        dl = Deadline.for_call(
            timeout_s,
            deadline,
            self.params.deadline_s,
            what=f"wan_flight send {src.kv.seq_id!r} to {self.location}",
        )
        # 64 KiB of room for the batch's other columns and its framing
        if src.layout.block_bytes + (1 << 16) > self.params.max_message_bytes:
            raise ChannelError(
                f"one KV block is {src.layout.block_bytes} bytes, over the message limit "
                f"{self.params.max_message_bytes}; raise max_message_bytes"
            )
        job = SendJob(src, transfer_id or uuid.uuid4().hex, dl, self.params.max_batch_bytes)
        self._jobs[job.transfer_id] = job
        t0 = time.perf_counter()
        try:
            n = src.kv.num_blocks
            num_batches = -(-n * src.layout.block_bytes // self.params.max_batch_bytes)
            num_streams = min(self.params.streams, max(1, num_batches))
            futs = [
                self._pool.submit(self._run_stream, job, s, num_streams) for s in range(num_streams)
            ]
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
                if not isinstance(error, ChannelAuthError):  # it would refuse the cancel too
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
        """Open every stream's connection and check credentials now, not in the first send."""
        dl = Deadline.of(timeout_s, what=f"wan_flight connect {self.location}")
        futs = [
            self._pool.submit(self.ping, dl.remaining(), stream)
            for stream in range(self.params.streams)
        ]
        for f in futs:
            f.result()

    def ping(self, timeout_s: float = 5.0, stream: int = 0) -> None:
        """Check reachability and credentials on one stream's connection."""
        dl = Deadline.of(timeout_s, what=f"wan_flight ping {self.location}")
        last: BaseException | None = None
        while True:
            try:
                self._action(stream, "ping", b"", dl)
                return
            except ChannelError:
                raise
            except RETRYABLE as exc:
                last = exc
                self._reset(stream)
                if dl.remaining() <= 0.05:
                    raise ChannelTimeout(
                        f"{dl.what}: deadline passed; last error: {first_line(last)}"
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
            except Exception:  # noqa: BLE001 - a broken client may fail to close; it is dropped
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
            raise translate(exc, dl, self.location) from None

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

    def _header(self, job: SendJob, stream: int, num_streams: int) -> bytes:
        kv = job.src.kv
        header = pb.KVTransfer(
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
        )
        return first_to_pb(header, kv.first).SerializeToString()

    def _run_stream(self, job: SendJob, stream: int, num_streams: int) -> None:
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
                    f"{exc}; last error: {first_line(last)}" if last else str(exc)
                ) from None
            try:
                if resume:
                    query = pb.KVStatus(transfer_id=job.transfer_id).SerializeToString()
                    status = pb.KVStatus.FromString(
                        self._action(stream, "kv.status", query, job.deadline)[0]
                    )
                    if status.cancelled:
                        raise ChannelCancelled(
                            f"{job.deadline.what}: receiver cancelled it: {status.reason}"
                        )
                    if status.known:
                        job.acked(bitmap_indices(status.received, job.src.kv.num_blocks))
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
            except RETRYABLE as exc:
                if isinstance(exc, fl.FlightError) and not isinstance(
                    exc, (fl.FlightUnavailableError, fl.FlightInternalError)
                ):
                    raise translate(exc, job.deadline, self.location) from None
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
                job.abort,
            )

    def _put(self, job: SendJob, stream: int, num_streams: int, always: bool) -> int:
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
            raise translate(exc, dl, self.location) from None
        inflight: deque[tuple[int, int]] = deque()
        sent = 0
        ready: float | None = None
        schema = src.schema()
        # this call's messages stay in order behind each other, other calls interleave with them;
        # delays are drawn from the stream's own seeded sequence (jitter_lane)
        lane = self._lane(stream)
        try:
            while run is not None:
                if job.abort.is_set():
                    break
                batch = src.batch(run[0], run[1], schema)
                if self._link is not None:
                    ready = self._link.hold(
                        batch.nbytes,
                        lane=lane,
                        deadline=dl,
                        ready_at=ready,
                        jitter_lane=stream,
                        abort=job.abort,
                    )
                    if job.abort.is_set():
                        break
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
                if isinstance(exc, AcksEnded):
                    # the acks stopped because the receiver failed the call: report why
                    cause = status
            if isinstance(cause, AcksEnded):  # no status either: treat it as a dropped stream
                cause = fl.FlightInternalError(str(cause))
            raise translate(cause, dl, self.location) from None
        finally:
            if self._link is not None:
                self._link.end_lane(lane)
        return sent

    def _lane(self, stream: int) -> str:
        """An emulation lane per DoPut call: `stream.call`, numbered per stream so a run repeats."""
        with self._lane_lock:
            self._calls[stream] = self._calls.get(stream, 0) + 1
            return f"{stream}.{self._calls[stream]}"

    def _take_ack(self, job: SendJob, inflight: deque, reader: Any, dl: Deadline) -> None:
        buf = reader.read()
        if buf is None:
            raise AcksEnded("wan_flight: ack stream ended early")
        ack = pb.KVAck.FromString(buf.to_pybytes())
        inflight.popleft()
        job.acked(list(ack.accepted))
        if ack.rejected:
            job.rejected(list(ack.rejected), self.max_block_retries)
