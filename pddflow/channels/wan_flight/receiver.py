"""The receiving end of a wan_flight channel: a Flight server that lands KV sets pushed with DoPut
and hands them out per sequence (protocol: docs/channels.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from pddflow.channels.codec_kv import BatchBlocks
from pddflow.channels.deadline import Deadline
from pddflow.channels.kv_inbox import KVInbox
from pddflow.channels.kv_landing import KVLanding
from pddflow.channels.kv_layout import KVLayout
from pddflow.channels.proto import pddflow_pb2 as pb
from pddflow.channels.security import AUTH_HEADER, TLSConfig, check_bearer
from pddflow.channels.wan_flight.params import WanFlightParams
from pddflow.core.host_memory import keep_freed_memory
from pddflow.core.payloads import KVBlocks

Alloc = Callable[[str, int, KVLayout], Any]


class _InboundTransfer:
    """One transfer being received (by any number of streams), and what status queries see of it
    after it completed or was cancelled."""

    def __init__(self, header: Any, landing: KVLanding, expires_at: float):
        self.transfer_id = header.transfer_id
        self.seq_id = header.seq_id
        self.num_blocks = header.num_blocks
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


class _BearerAuth(fl.ServerMiddlewareFactory):
    def __init__(self, token: str):
        super().__init__()
        self.token = token

    def start_call(self, info: Any, headers: dict) -> None:
        refusal = check_bearer(headers.get(AUTH_HEADER), self.token, "wan_flight")
        if refusal:
            raise fl.FlightUnauthenticatedError(refusal)
        return None


class _FlightServer(fl.FlightServerBase):
    def __init__(
        self, owner: WanFlightReceiver, location: str, tls: TLSConfig | None, token: str | None
    ):
        kwargs: dict[str, Any] = {}
        if tls is not None:
            cert, key = tls.server_pair()
            kwargs["tls_certificates"] = [fl.CertKeyPair(cert=cert, key=key)]
        if token:
            kwargs["middleware"] = {"auth": _BearerAuth(token)}
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
    """Thread-safe; the Flight server runs on its own threads from construction until close()."""

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
            # else every batch page-faults gRPC's freed receive buffers in again
            keep_freed_memory()
        self._lock = threading.Lock()
        self._create_lock = threading.Lock()
        self._inbound: dict[str, _InboundTransfer] = {}
        self._inbox = KVInbox("wan_flight")
        self._closed = False
        scheme = "grpc+tls" if params.tls is not None else "grpc"
        self._server = _FlightServer(self, f"{scheme}://{host}:{port}", params.tls, params.token)
        self.host = host
        self.port = self._server.port
        self.location = f"{scheme}://{host}:{self.port}"
        self.address = self.location  # what a sender connects to, named as on every channel kind

    def recv(
        self,
        seq_id: str | None = None,
        timeout_s: float | None = None,
        deadline: float | None = None,
    ) -> KVBlocks:
        dl = Deadline.for_call(
            timeout_s,
            deadline,
            self.params.deadline_s,
            what=f"wan_flight recv{'(' + seq_id + ')' if seq_id else ''}",
        )
        with self._lock:
            self._sweep_locked()
        return self._inbox.get(seq_id, dl)

    def cancel(self, seq_id: str, reason: str = "cancelled by receiver") -> None:
        """Drop every partial transfer of seq_id, free its memory and refuse further blocks."""
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

    def _drop_seq_locked(self, seq_id: str, reason: str) -> None:
        for inb in self._inbound.values():
            if inb.seq_id == seq_id and not inb.done:
                inb.cancelled = reason
                inb.landing = None  # frees the partial KV

    def _sweep_locked(self) -> None:
        now = time.monotonic()
        for tid in [t for t, i in self._inbound.items() if i.expires_at < now]:
            del self._inbound[tid]

    def _get_inbound(self, header: Any) -> _InboundTransfer:
        # one allocation per transfer, however many of its streams arrive at once
        with self._create_lock:
            with self._lock:
                if self._closed:
                    raise fl.FlightUnavailableError("wan_flight receiver is closing")
                self._sweep_locked()
                reason = self._inbox.cancelled_reason(header.seq_id)
                if reason is not None:
                    raise fl.FlightCancelledError(
                        f"wan_flight: {header.seq_id!r} cancelled by receiver: {reason}"
                    )
                inb = self._inbound.get(header.transfer_id)
                if inb is not None:
                    inb.expires_at = max(inb.expires_at, time.monotonic() + header.timeout_s + 5.0)
                    return inb
            layout = KVLayout.from_proto(header.layout)
            dest = self._alloc(header.seq_id, header.num_blocks, layout) if self._alloc else None
            landing = KVLanding.from_transfer(header, layout, dest, self._tensor_lib)
            with self._lock:
                inb = self._inbound[header.transfer_id] = _InboundTransfer(
                    header, landing, time.monotonic() + header.timeout_s + 5.0
                )
                return inb

    def _serve_put(self, descriptor: Any, reader: Any, writer: Any) -> None:
        try:
            header = pb.KVTransfer.FromString(descriptor.command)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the client's error
            raise fl.FlightServerError(f"wan_flight: bad transfer descriptor: {exc}") from None
        inb = self._get_inbound(header)
        block_bytes = KVLayout.from_proto(header.layout).block_bytes
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
                    accepted, rejected = BatchBlocks.of(batch, block_bytes).index.tolist(), []
                else:
                    raise fl.FlightCancelledError(
                        f"wan_flight: {inb.seq_id!r} cancelled by receiver: {inb.cancelled}"
                    )
            else:
                landing = inb.landing
                accepted, rejected = landing.land(BatchBlocks.of(batch, block_bytes))
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

    def _complete(self, inb: _InboundTransfer) -> None:
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
