"""token_ids: TokenIds and control messages over one gRPC bidirectional stream per peer.

The Extend-Decode handoff (RelayDecode -> MainDecode) sends token IDs, not KV: a 100-token handoff
is a few hundred bytes. Control messages (cancel, release) ride the same stream in both directions,
so a failed leg can cancel its pair and a finished one can release KV.

Delivery: every envelope carries msg_no, numbered per (sender, seq_id) from 0. The receiver
delivers each sequence strictly in msg_no order (holding early arrivals), drops duplicates, and
acknowledges an envelope once it is in the application's queue. `send` returns when the ack
arrives or raises ChannelTimeout at its deadline. If the stream breaks, the client reconnects in the
background and resends what is unacknowledged; per-peer state on the server outlives a stream, so
resends are deduplicated. A message whose send timed out is no longer resent: the caller treats
the leg as failed (at-most-once past the deadline).

Both ends: TLS, bearer-token auth (the server refuses a missing or wrong token with
UNAUTHENTICATED; the client raises ChannelAuthError), keepalive, message size limits, and optional
link emulation (each end shapes what it sends). Threads, not asyncio: every call blocks with a
deadline; `send_async` queues at once and returns a concurrent.futures.Future.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import grpc

from pddflow.channels.codec_tokens import Control, Message, envelope, payload_of, seq_of
from pddflow.channels.deadline import Deadline
from pddflow.channels.emulation import EmulatedLink
from pddflow.channels.errors import ChannelAuthError, ChannelClosed, ChannelError, ChannelTimeout
from pddflow.channels.proto import pddflow_pb2 as pb
from pddflow.channels.security import AUTH_HEADER, TLSConfig, bearer, check_bearer
from pddflow.core.link import LinkModel
from pddflow.core.payloads import TokenIds

SERVICE = "pddflow.channels.v1.TokenIdsChannel"
METHOD = f"/{SERVICE}/Stream"
VERSION = 1
_FRAMING = 14  # gRPC prefix + HTTP/2 frame header, for the emulated size of a message
_SEQ_MEMORY = 1 << 16  # sequences whose receive order is remembered (LRU)


@dataclass(frozen=True)
class TokenIdsParams:
    """Channel params a graph edge passes (`channel: token_ids`)."""

    deadline_s: float = 5.0
    token: str | None = None
    tls: TLSConfig | None = None
    keepalive_s: float = 30.0
    max_message_bytes: int = 4 << 20
    emulate: LinkModel | None = None
    seed: int = 0
    max_streams: int = 64  # server: concurrent peers


def _grpc_options(p: TokenIdsParams, server: bool) -> list[tuple[str, int]]:
    ka = int(p.keepalive_s * 1000)
    opts = [
        ("grpc.max_send_message_length", p.max_message_bytes),
        ("grpc.max_receive_message_length", p.max_message_bytes),
        ("grpc.keepalive_time_ms", ka),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if server:
        opts += [
            ("grpc.http2.min_ping_interval_without_data_ms", max(1000, ka // 2)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.so_reuseport", 0),
        ]
    else:
        opts += [
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.use_local_subchannel_pool", 1),
        ]
    return opts


# ------------------------------------------------------------------------------ shared pieces


class _Outbox:
    """Envelopes for one gRPC stream, each released at its emulated arrival time (now, unshaped)."""

    def __init__(self, link: EmulatedLink | None):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._link = link
        self.closed = threading.Event()

    def put(self, env: pb.Envelope) -> None:
        arrival = (
            self._link.schedule(env.ByteSize() + _FRAMING)[1] if self._link is not None else 0.0
        )
        self._q.put((arrival, env))

    def close(self) -> None:
        self.closed.set()
        self._q.put(None)

    def drain(self, alive: Callable[[], bool]) -> Iterator[pb.Envelope]:
        while True:
            try:
                item = self._q.get(timeout=0.5)
            except queue.Empty:
                if self.closed.is_set() or not alive():
                    return
                continue
            if item is None:
                return
            arrival, env = item
            if arrival:
                wait = arrival - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            yield env


class _Endpoint:
    """Ordering and acknowledgement state for one remote peer; outlives any one stream."""

    def __init__(self, remote: str, deliver: Callable[[Message], bool]):
        self.remote = remote
        self._deliver = deliver
        self._lock = threading.Lock()
        self._next_no: dict[str, int] = {}
        self._pending: OrderedDict[tuple[str, int], tuple[pb.Envelope, Future, Deadline]] = (
            OrderedDict()
        )
        self._expect: OrderedDict[str, int] = OrderedDict()
        self._held: dict[str, dict[int, pb.Envelope]] = {}
        self._outbox: _Outbox | None = None

    def submit(self, payload: TokenIds | Control, dl: Deadline) -> Future:
        fut: Future = Future()
        with self._lock:
            seq = payload.seq_id
            no = self._next_no.get(seq, 0)
            self._next_no[seq] = no + 1
            env = envelope(payload, no)
            self._pending[(seq, no)] = (env, fut, dl)
            if self._outbox is not None:
                self._outbox.put(env)
        return fut

    def expire(self) -> None:
        """Fail (and stop resending) every envelope whose deadline passed unacknowledged."""
        with self._lock:
            dead = [k for k, (_, _, dl) in self._pending.items() if dl.expired()]
            items = [self._pending.pop(k) for k in dead]
        for _, fut, dl in items:
            if not fut.done():
                fut.set_exception(dl.timeout("waiting for the ack"))

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def attach(self, outbox: _Outbox) -> None:
        with self._lock:
            self._outbox = outbox
            for env, _, _ in self._pending.values():  # resend in submit order
                outbox.put(env)

    def detach(self, outbox: _Outbox) -> None:
        with self._lock:
            if self._outbox is outbox:
                self._outbox = None

    def fail_all(self, exc: BaseException) -> None:
        with self._lock:
            items, self._pending = list(self._pending.values()), OrderedDict()
        for _, fut, _ in items:
            if not fut.done():
                fut.set_exception(exc)

    def on_envelope(self, env: pb.Envelope) -> None:
        which = env.WhichOneof("body")
        if which == "ack":
            with self._lock:
                item = self._pending.pop((env.ack.seq_id, env.ack.msg_no), None)
            if item is not None and not item[1].done():
                if env.ack.ok:
                    item[1].set_result(None)
                else:
                    item[1].set_exception(
                        ChannelError(
                            f"token_ids peer {self.remote!r} refused "
                            f"{env.ack.seq_id!r}#{env.ack.msg_no}: {env.ack.error}"
                        )
                    )
            return
        if which not in ("tokens", "control"):
            return
        seq = seq_of(env)
        with self._lock:  # deliveries happen under the lock so one sequence is never reordered
            exp = self._expect.get(seq, 0)
            if env.msg_no < exp:
                self._ack(seq, env.msg_no, True, "")  # a resend of something delivered: ack again
                return
            if env.msg_no > exp:
                self._held.setdefault(seq, {})[env.msg_no] = env  # early: wait for the gap
                return
            ready = [env]
            held = self._held.get(seq, {})
            while exp + len(ready) in held:
                ready.append(held.pop(exp + len(ready)))
            if not held:
                self._held.pop(seq, None)
            for e in ready:
                ok = self._deliver(Message(self.remote, payload_of(e)))  # type: ignore[arg-type]
                self._ack(seq, e.msg_no, ok, "" if ok else "receiver closed")
            self._expect[seq] = exp + len(ready)
            self._expect.move_to_end(seq)
            while len(self._expect) > _SEQ_MEMORY:
                old, _ = self._expect.popitem(last=False)
                self._held.pop(old, None)

    def _ack(self, seq: str, no: int, ok: bool, error: str) -> None:
        if self._outbox is not None:
            self._outbox.put(pb.Envelope(ack=pb.Ack(seq_id=seq, msg_no=no, ok=ok, error=error)))


class _Watchdog:
    """Expires unacknowledged envelopes at their deadlines, so no wait outlives its deadline
    even when nobody is blocked on the future."""

    def __init__(self, endpoints: Callable[[], list[_Endpoint]]):
        self._endpoints = endpoints
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="token_ids-watchdog")
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for ep in self._endpoints():
                ep.expire()

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=2)


def _rpc_error(exc: grpc.RpcError, target: str) -> ChannelError:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return ChannelAuthError(f"token_ids server at {target} refused our credentials: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ChannelTimeout(f"token_ids {target}: {details}")
    return ChannelClosed(
        f"token_ids stream to {target} ended: {code.name if code else ''} {details}"
    )


class _Mailbox:
    def __init__(self) -> None:
        self._q: queue.Queue[Message] = queue.Queue()
        self.closed = False

    def deliver(self, m: Message) -> bool:
        if self.closed:
            return False
        self._q.put(m)
        return True

    def get(self, dl: Deadline) -> Message:
        try:
            return self._q.get(timeout=dl.remaining())
        except queue.Empty:
            raise dl.timeout("waiting for a message") from None


# ------------------------------------------------------------------------------------ server


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
        self._mailbox = _Mailbox()
        self._endpoints: dict[str, _Endpoint] = {}
        self._outboxes: set[_Outbox] = set()
        self._lock = threading.Lock()
        self._link = (
            EmulatedLink(params.emulate, seed=params.seed * 2 + 1) if params.emulate else None
        )
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=params.max_streams + 4, thread_name_prefix="token_ids"),
            options=_grpc_options(params, server=True),
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
        self._watchdog = _Watchdog(self._all_endpoints)
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

    def recv(self, timeout_s: float | None = None, deadline: float | None = None) -> Message:
        return self._mailbox.get(
            Deadline.of(_t(timeout_s, deadline, self.params), deadline, what="token_ids recv")
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
        dl = Deadline.of(
            _t(timeout_s, deadline, self.params), deadline, what=f"token_ids send to {peer!r}"
        )
        _wait_ack(self._endpoint(peer).submit(payload, dl), dl)

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
        dl = Deadline.of(
            _t(timeout_s, deadline, self.params), deadline, what=f"token_ids send to {peer!r}"
        )
        return self._endpoint(peer).submit(payload, dl)

    def peers(self) -> list[str]:
        with self._lock:
            return sorted(self._endpoints)

    def close(self, grace_s: float = 0.5) -> None:
        self._mailbox.closed = True
        with self._lock:
            for out in self._outboxes:
                out.close()
            eps = list(self._endpoints.values())
        for ep in eps:
            ep.fail_all(ChannelClosed("token_ids server closed"))
        self._watchdog.stop()
        self._server.stop(grace_s).wait(grace_s + 1)

    def __enter__(self) -> TokenIdsServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _all_endpoints(self) -> list[_Endpoint]:
        with self._lock:
            return list(self._endpoints.values())

    def _endpoint(self, peer: str) -> _Endpoint:
        with self._lock:
            ep = self._endpoints.get(peer)
            if ep is None:
                ep = self._endpoints[peer] = _Endpoint(peer, self._mailbox.deliver)
            return ep

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
        ep = self._endpoint(first.hello.peer or context.peer())
        out = _Outbox(self._link)
        out.put(pb.Envelope(hello=pb.Hello(peer=self.name, version=VERSION)))
        ep.attach(out)
        with self._lock:
            self._outboxes.add(out)

        def read() -> None:
            try:
                for env in request_iterator:
                    ep.on_envelope(env)
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
            ep.detach(out)
            out.close()
            with self._lock:
                self._outboxes.discard(out)


# ------------------------------------------------------------------------------------ client


class TokenIdsClient:
    """The connecting end (RelayDecode for handoffs). `send` connects on first use."""

    def __init__(
        self, target: str, *, params: TokenIdsParams = TokenIdsParams(), name: str | None = None
    ):
        self.target, self.params = target, params
        self.name = name or f"peer-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        opts = _grpc_options(params, server=False)
        if params.tls is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=params.tls.roots())
            self._channel = grpc.secure_channel(target, creds, options=opts)
        else:
            self._channel = grpc.insecure_channel(target, options=opts)
        self._call_fn = self._channel.stream_stream(
            METHOD,
            request_serializer=pb.Envelope.SerializeToString,
            response_deserializer=pb.Envelope.FromString,
        )
        self._metadata = [(AUTH_HEADER, bearer(params.token))] if params.token else []
        self._mailbox = _Mailbox()
        self._ep = _Endpoint("server", self._mailbox.deliver)
        self._link = EmulatedLink(params.emulate, seed=params.seed * 2) if params.emulate else None
        self._conn_lock = threading.Lock()
        self._live: tuple[Any, _Outbox] | None = None
        self._fatal: ChannelError | None = None
        self._closed = threading.Event()
        self._kick_lock = threading.Lock()
        self._connecting = False
        self._watchdog = _Watchdog(lambda: [self._ep])

    # ------------------------------------------------------------------ runtime API

    def connect(self, timeout_s: float | None = None, deadline: float | None = None) -> None:
        self._ensure(
            Deadline.of(
                _t(timeout_s, deadline, self.params),
                deadline,
                what=f"token_ids connect {self.target}",
            )
        )

    def send(
        self,
        payload: TokenIds | Control,
        *,
        timeout_s: float | None = None,
        deadline: float | None = None,
    ) -> None:
        """Send TokenIds or Control and wait for the peer's ack (ChannelTimeout at the deadline)."""
        dl = self._deadline(payload, timeout_s, deadline)
        self._ensure(dl)
        _wait_ack(self._ep.submit(payload, dl), dl)

    def send_async(
        self,
        payload: TokenIds | Control,
        *,
        timeout_s: float | None = None,
        deadline: float | None = None,
    ) -> Future[None]:
        """Queue now, without blocking (messages of one sequence keep call order), and return a
        Future that resolves on the ack or fails at the deadline (ChannelTimeout; ChannelAuthError
        if the server refuses us). Not connected yet: a background thread connects and sends."""
        dl = self._deadline(payload, timeout_s, deadline)
        if self._closed.is_set():
            raise ChannelClosed("token_ids client closed")
        if self._fatal is not None:
            raise self._fatal
        fut = self._ep.submit(payload, dl)
        if self._live is None:
            self._kick()
        return fut

    def recv(self, timeout_s: float | None = None, deadline: float | None = None) -> Message:
        """The next TokenIds or Control the server sent us."""
        return self._mailbox.get(
            Deadline.of(_t(timeout_s, deadline, self.params), deadline, what="token_ids recv")
        )

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._mailbox.closed = True
        with self._conn_lock:
            live, self._live = self._live, None
        if live is not None:
            live[1].close()
            live[0].cancel()
        self._ep.fail_all(ChannelClosed("token_ids client closed"))
        self._watchdog.stop()
        self._channel.close()

    def __enter__(self) -> TokenIdsClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _deadline(self, payload: Any, timeout_s: float | None, deadline: float | None) -> Deadline:
        return Deadline.of(
            _t(timeout_s, deadline, self.params),
            deadline,
            what=f"token_ids send {payload.seq_id!r} to {self.target}",
        )

    def _ensure(self, dl: Deadline) -> None:
        with self._conn_lock:
            if self._closed.is_set():
                raise ChannelClosed("token_ids client closed")
            if self._fatal is not None:
                raise self._fatal
            if self._live is None:
                self._open(dl)

    def _open(self, dl: Deadline) -> None:
        ready = grpc.channel_ready_future(self._channel)
        try:
            while True:  # in slices, so close() is not held up by a peer that never answers
                try:
                    ready.result(timeout=max(min(dl.remaining(), 0.1), 1e-3))
                    break
                except grpc.FutureTimeoutError:
                    if self._closed.is_set():
                        raise ChannelClosed("token_ids client closed") from None
                    if dl.expired():
                        raise dl.timeout(f"connecting to {self.target} (no answer)") from None
        finally:
            ready.cancel()
        out = _Outbox(self._link)
        out.put(pb.Envelope(hello=pb.Hello(peer=self.name, version=VERSION)))
        self._ep.attach(out)  # unacknowledged envelopes go right after the Hello
        call = self._call_fn(out.drain(lambda: not self._closed.is_set()), metadata=self._metadata)
        hello = threading.Event()
        state: dict[str, ChannelError | None] = {"error": None}
        threading.Thread(
            target=self._read,
            args=(call, out, hello, state),
            daemon=True,
            name="token_ids-client-read",
        ).start()
        if not hello.wait(dl.remaining()) or state["error"] is not None:
            self._ep.detach(out)
            out.close()
            call.cancel()
            err = state["error"]
            if isinstance(err, ChannelAuthError):
                raise err
            if err is not None and not dl.expired():
                raise err
            raise dl.timeout(f"waiting for {self.target} to answer the handshake")
        self._live = (call, out)

    def _read(self, call: Any, out: _Outbox, hello: threading.Event, state: dict) -> None:
        try:
            for env in call:
                if env.WhichOneof("body") == "hello":
                    hello.set()
                    continue
                self._ep.on_envelope(env)
        except grpc.RpcError as exc:
            state["error"] = _rpc_error(exc, self.target)
        finally:
            out.close()
            self._ep.detach(out)
            if state["error"] is None:
                state["error"] = ChannelClosed(f"token_ids stream to {self.target} ended")
            hello.set()  # before taking the lock: _open may hold it while waiting for this
            with self._conn_lock:
                was_live = self._live is not None and self._live[1] is out
                if was_live:
                    self._live = None
            if isinstance(state["error"], ChannelAuthError):
                self._fatal = state["error"]
                self._ep.fail_all(state["error"])
            elif was_live and not self._closed.is_set():
                self._reconnect()

    def _kick(self) -> None:
        with self._kick_lock:
            if self._connecting:
                return
            self._connecting = True

        def run() -> None:
            try:
                self._reconnect()
            finally:
                with self._kick_lock:
                    self._connecting = False

        threading.Thread(target=run, daemon=True, name="token_ids-connect").start()

    def _reconnect(self) -> None:
        """Reopen the stream (in the dead stream's reader thread) while messages await an ack."""
        backoff = 0.05
        while not self._closed.is_set() and self._fatal is None and self._ep.has_pending():
            try:
                self._ensure(
                    Deadline.of(
                        max(1.0, self.params.deadline_s), what=f"token_ids reconnect {self.target}"
                    )
                )
                if self._live is not None:
                    return
            except ChannelAuthError as exc:
                self._fatal = exc
                self._ep.fail_all(exc)
                return
            except ChannelError:
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)


def _t(timeout_s: float | None, deadline: float | None, params: TokenIdsParams) -> float | None:
    return timeout_s if timeout_s is not None or deadline is not None else params.deadline_s


def _wait_ack(fut: Future, dl: Deadline) -> None:
    # the watchdog fails the future at the deadline; the margin only covers its 50 ms tick
    try:
        fut.result(timeout=dl.remaining() + 0.5)
    except FutureTimeout:
        raise dl.timeout("waiting for the ack") from None
