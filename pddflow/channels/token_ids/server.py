"""The listening end of a token_ids channel (MainDecode for handoffs); peers are named by their
Hello (protocol: `protocol.py`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc

from pddflow.channels.deadline import Deadline
from pddflow.channels.emulation import EmulatedLink
from pddflow.channels.errors import ChannelClosed, ChannelError
from pddflow.channels.proto import pddflow_pb2 as pb
from pddflow.channels.security import AUTH_HEADER, check_bearer
from pddflow.channels.token_ids.codec import Control, Message
from pddflow.channels.token_ids.delivery import AckWatchdog, Mailbox, Outbox, PeerDelivery, wait_ack
from pddflow.channels.token_ids.protocol import SERVICE, VERSION, TokenIdsParams, grpc_options
from pddflow.core.payloads import TokenIds


class _AuthInterceptor(grpc.ServerInterceptor):
    def __init__(self, token: str):
        self._token = token

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        values = [v for k, v in (details.invocation_metadata or ()) if k == AUTH_HEADER]
        refusal = check_bearer(values, self._token, "token_ids")
        if refusal is None:
            return continuation(details)

        def deny(request_iterator: Any, context: Any) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal)

        return grpc.stream_stream_rpc_method_handler(deny)


class TokenIdsServer:
    """The listening end (MainDecode for handoffs). Peers are named by their Hello."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        params: TokenIdsParams = TokenIdsParams(),
        name: str = "server",
    ):
        self.params, self.name = params, name
        self._mailbox = Mailbox()
        self._deliveries: dict[str, PeerDelivery] = {}
        self._outboxes: set[Outbox] = set()
        self._lock = threading.Lock()
        self._link = (
            EmulatedLink(params.emulate, seed=params.seed * 2 + 1) if params.emulate else None
        )
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=params.max_streams + 4, thread_name_prefix="token_ids"),
            options=grpc_options(params, server=True),
            interceptors=[_AuthInterceptor(params.token)] if params.token else [],
            maximum_concurrent_rpcs=params.max_streams,
        )
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Stream": grpc.stream_stream_rpc_method_handler(
                    self._stream,
                    request_deserializer=pb.Envelope.FromString,
                    response_serializer=pb.Envelope.SerializeToString,
                )
            },
        )
        self._server.add_generic_rpc_handlers((handler,))
        self._watchdog = AckWatchdog(self._all_deliveries)
        if params.tls is not None:
            cert, key = params.tls.server_pair()
            self.port = self._server.add_secure_port(
                f"{host}:{port}", grpc.ssl_server_credentials([(key, cert)])
            )
        else:
            self.port = self._server.add_insecure_port(f"{host}:{port}")
        if not self.port:
            raise ChannelError(f"token_ids: cannot bind {host}:{port}")
        self.address = f"{host}:{self.port}"
        self._server.start()

    @property
    def emulated_link(self) -> EmulatedLink | None:
        """What shapes this end's sends (None: not emulated): a link degrade retunes it."""
        return self._link

    def recv(self, timeout_s: float | None = None, deadline: float | None = None) -> Message:
        return self._mailbox.get(
            Deadline.for_call(timeout_s, deadline, self.params.deadline_s, what="token_ids recv")
        )

    def send(
        self,
        peer: str,
        payload: TokenIds | Control,
        *,
        timeout_s: float | None = None,
        deadline: float | None = None,
    ) -> None:
        """Deliver to a connected (or reconnecting) peer and wait for its ack."""
        dl = Deadline.for_call(
            timeout_s, deadline, self.params.deadline_s, what=f"token_ids send to {peer!r}"
        )
        wait_ack(self._delivery(peer).submit(payload, dl), dl)

    def send_async(
        self,
        peer: str,
        payload: TokenIds | Control,
        *,
        timeout_s: float | None = None,
        deadline: float | None = None,
    ) -> Future[None]:
        """Queue for the peer now (in call order); the Future resolves on its ack or fails with
        ChannelTimeout at the deadline."""
        dl = Deadline.for_call(
            timeout_s, deadline, self.params.deadline_s, what=f"token_ids send to {peer!r}"
        )
        return self._delivery(peer).submit(payload, dl)

    def peers(self) -> list[str]:
        with self._lock:
            return sorted(self._deliveries)

    def close(self, grace_s: float = 0.5) -> None:
        self._mailbox.closed = True
        with self._lock:
            for out in self._outboxes:
                out.close()
            deliveries = list(self._deliveries.values())
        for delivery in deliveries:
            delivery.fail_all(ChannelClosed("token_ids server closed"))
        self._watchdog.stop()
        self._server.stop(grace_s).wait(grace_s + 1)

    def __enter__(self) -> TokenIdsServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _all_deliveries(self) -> list[PeerDelivery]:
        with self._lock:
            return list(self._deliveries.values())

    def _delivery(self, peer: str) -> PeerDelivery:
        with self._lock:
            delivery = self._deliveries.get(peer)
            if delivery is None:
                delivery = self._deliveries[peer] = PeerDelivery(peer, self._mailbox.deliver)
            return delivery

    def _stream(self, request_iterator: Any, context: Any) -> Iterator[pb.Envelope]:
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        if first.WhichOneof("body") != "hello":
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "token_ids: the first envelope must be a Hello"
            )
        if first.hello.version != VERSION:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"token_ids: protocol version {first.hello.version}, this server speaks {VERSION}",
            )
        delivery = self._delivery(first.hello.peer or context.peer())
        out = Outbox(self._link)
        out.put(pb.Envelope(hello=pb.Hello(peer=self.name, version=VERSION)))
        delivery.attach(out)
        with self._lock:
            self._outboxes.add(out)

        def read() -> None:
            try:
                for env in request_iterator:
                    delivery.on_envelope(env)
            except grpc.RpcError:
                pass
            except Exception:  # noqa: BLE001 - a bad envelope ends this stream, not the server
                context.cancel()
            finally:
                out.close()

        reader = threading.Thread(target=read, daemon=True, name="token_ids-read")
        reader.start()
        try:
            yield from out.drain(context.is_active)
        finally:
            delivery.detach(out)
            out.close()
            with self._lock:
                self._outboxes.discard(out)
