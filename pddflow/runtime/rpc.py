"""gRPC plumbing of the control plane, registered by hand (no generated stubs, no pickle). Every
call carries the deployment's bearer token (checked in constant time: anyone else gets
UNAUTHENTICATED), over mutual TLS when the deployment has certificates, and a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from pddflow.channels.security import AUTH_HEADER, TLSConfig, bearer, check_bearer
from pddflow.runtime.proto import runtime_pb2 as pb

WORKER = "pddflow.runtime.v1.Worker"
FRONTEND = "pddflow.runtime.v1.Frontend"
API_SERVER = "pddflow.runtime.v1.ApiServer"
CALL_TIMEOUT_S = 10.0
_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.so_reuseport", 0),
    # a restarted worker listens again within seconds: reconnect soon, not after minutes
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]
# The server must accept the clients' 10 s keepalive pings; gRPC's default (one per 5 minutes)
# answers them with GOAWAY "too_many_pings", which would cut a worker's report stream.
_SERVER_OPTIONS = _OPTIONS + [
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]


@dataclass(frozen=True)
class Credentials:
    """What both ends of the control plane must show: the deployment's token, and its certificate
    (when it has one) for mutual TLS."""

    token: str
    tls: TLSConfig | None = None

    def server(self) -> grpc.ServerCredentials | None:
        if self.tls is None:
            return None
        key, cert = self.tls.private_key_bytes(), self.tls.cert_chain_bytes()
        roots = self.tls.roots()
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=roots, require_client_auth=True
        )

    def channel(self, address: str) -> grpc.Channel:
        if self.tls is None:
            return grpc.insecure_channel(address, options=_OPTIONS)
        return grpc.secure_channel(address, self._channel_credentials(), options=_OPTIONS)

    def aio_channel(self, address: str) -> grpc.aio.Channel:
        """The same channel for the running asyncio loop."""
        if self.tls is None:
            return grpc.aio.insecure_channel(address, options=_OPTIONS)
        return grpc.aio.secure_channel(address, self._channel_credentials(), options=_OPTIONS)

    def _channel_credentials(self) -> grpc.ChannelCredentials:
        assert self.tls is not None
        return grpc.ssl_channel_credentials(
            root_certificates=self.tls.roots(),
            private_key=self.tls.private_key_bytes(),
            certificate_chain=self.tls.cert_chain_bytes(),
        )

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((AUTH_HEADER, bearer(self.token)),)

    def refusal(self, context: Any) -> str | None:
        values = [v for k, v in (context.invocation_metadata() or ()) if k == AUTH_HEADER]
        return check_bearer(values, self.token, "control plane")


# method -> (request type, response type)
WORKER_METHODS: dict[str, tuple[type, type]] = {
    "Submit": (pb.LegOrder, pb.Reply),
    "Abort": (pb.Cancel, pb.Reply),
    "Recompute": (pb.Cancel, pb.Reply),
    "Status": (pb.Empty, pb.WorkerStatus),
    "TuneLink": (pb.LinkTuning, pb.LinkTuned),
    "Lease": (pb.LeaseGrant, pb.Reply),
}


def serve(
    service: str,
    credentials: Credentials,
    unary: dict[str, tuple[type, type, Callable]] | None = None,
    streams_in: dict[str, tuple[type, type, Callable]] | None = None,
    port: int = 0,
    threads: int = 8,
    host: str = "127.0.0.1",
) -> tuple[grpc.Server, int]:
    """host: the address to bind (a deployment's wiring says which: the node's address)."""
    server = grpc.server(
        ThreadPoolExecutor(max_workers=threads, thread_name_prefix=service.rsplit(".", 1)[-1]),
        options=_SERVER_OPTIONS,
    )

    def checked(fn: Callable, *args: Any) -> Any:
        ctx = args[-1]
        refusal = credentials.refusal(ctx)
        if refusal is not None:
            ctx.abort(grpc.StatusCode.UNAUTHENTICATED, refusal)
        return fn(*args)

    handlers: dict[str, Any] = {}
    for name, (req, resp, fn) in (unary or {}).items():
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            lambda r, ctx, fn=fn: checked(lambda r, _ctx: fn(r), r, ctx),
            request_deserializer=req.FromString,
            response_serializer=resp.SerializeToString,
        )
    for name, (req, resp, fn) in (streams_in or {}).items():
        handlers[name] = grpc.stream_unary_rpc_method_handler(
            lambda it, ctx, fn=fn: checked(fn, it, ctx),
            request_deserializer=req.FromString,
            response_serializer=resp.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    creds = credentials.server()
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    if not bound:
        raise OSError(f"cannot bind {address} for {service}")
    server.start()
    return server, bound


class WorkerClient:
    def __init__(self, address: str, credentials: Credentials):
        self.address, self.credentials = address, credentials
        self.metadata = credentials.metadata()
        self.channel = credentials.channel(address)
        # the frontend loop's channel (send): a sync channel's future starts a thread whenever
        # none of its calls is in flight, which an idle worker's channel mostly is
        self._aio: tuple[asyncio.AbstractEventLoop, grpc.aio.Channel, dict[str, Any]] | None = None
        self._calls = _worker_stubs(self.channel)

    def call(self, method: str, message: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        return self._calls[method](
            message, timeout=timeout_s, metadata=self.metadata, wait_for_ready=True
        )

    def future(self, method: str, message: Any, timeout_s: float = CALL_TIMEOUT_S) -> grpc.Future:
        # wait_for_ready: a channel still backing off from a restarted worker connects first
        return self._calls[method].future(
            message, timeout=timeout_s, metadata=self.metadata, wait_for_ready=True
        )

    def send(self, method: str, message: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        """The call without waiting for it: a task on the calling thread's running asyncio loop
        (grpc.aio), else (startup, another thread) a grpc future. Both take done callbacks;
        `call_error` reads either."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self.future(method, message, timeout_s)
        if self._aio is None or self._aio[0] is not loop:
            channel = self.credentials.aio_channel(self.address)
            self._aio = (loop, channel, _worker_stubs(channel))
        call = self._aio[2][method](
            message, timeout=timeout_s, metadata=self.metadata, wait_for_ready=True
        )
        return loop.create_task(_awaited(call))

    def close(self) -> None:
        self.channel.close()
        if self._aio is not None:
            loop, channel, _ = self._aio
            self._aio = None
            if not loop.is_closed():
                try:
                    asyncio.run_coroutine_threadsafe(channel.close(), loop)
                except RuntimeError:  # the loop is stopping: its channels go with it
                    pass


def _worker_stubs(channel: Any) -> dict[str, Any]:
    """A worker's unary methods on `channel` (sync or grpc.aio: the same calls)."""
    return {
        name: channel.unary_unary(
            f"/{WORKER}/{name}",
            request_serializer=req.SerializeToString,
            response_deserializer=resp.FromString,
        )
        for name, (req, resp) in WORKER_METHODS.items()
    }


async def _awaited(call: Any) -> Any:
    return await call


def call_error(fut: Any) -> BaseException | None:
    """What a finished `send` (a task or a grpc future) failed with; None when it answered."""
    try:
        return fut.exception()
    except BaseException as exc:  # noqa: BLE001 - cancelled: it did not answer
        return exc


def open_reports(
    address: str, messages: Iterator[pb.Report], credentials: Credentials, service: str = FRONTEND
) -> grpc.Future:
    """A worker's report stream to the frontend (or to an API process: its tokens), until
    `messages` ends or the channel closes."""
    channel = credentials.channel(address)
    call = channel.stream_unary(
        f"/{service}/Reports",
        request_serializer=pb.Report.SerializeToString,
        response_deserializer=pb.Empty.FromString,
    )
    # the frontend may still be starting
    fut = call.future(messages, wait_for_ready=True, metadata=credentials.metadata())
    fut.add_done_callback(lambda _: channel.close())
    return fut


def grpc_text(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    return details() if callable(details) else str(exc)
