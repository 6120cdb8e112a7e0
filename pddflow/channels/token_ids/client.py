"""The connecting end of a token_ids channel (RelayDecode for handoffs): connects on first use,
and reconnects and resends in the background while messages await their ack (protocol:
`protocol.py`)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Any

import grpc

from pddflow.channels.deadline import Deadline
from pddflow.channels.emulation import EmulatedLink
from pddflow.channels.errors import ChannelAuthError, ChannelClosed, ChannelError
from pddflow.channels.proto import pddflow_pb2 as pb
from pddflow.channels.security import AUTH_HEADER, bearer
from pddflow.channels.token_ids.codec import Control, Message
from pddflow.channels.token_ids.delivery import AckWatchdog, Mailbox, Outbox, PeerDelivery, wait_ack
from pddflow.channels.token_ids.protocol import (
    METHOD,
    VERSION,
    TokenIdsParams,
    grpc_options,
    rpc_error,
)
from pddflow.core.payloads import TokenIds


class TokenIdsClient:
    """The connecting end (RelayDecode for handoffs). `send` connects on first use."""

    def __init__(
        self, target: str, *, params: TokenIdsParams = TokenIdsParams(), name: str | None = None
    ):
        self.target, self.params = target, params
        self.name = name or f"peer-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        opts = grpc_options(params, server=False)
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
        self._mailbox = Mailbox()
        self._delivery = PeerDelivery("server", self._mailbox.deliver)
        # the server's end draws from seed * 2 + 1: the two directions jitter independently
        self._link = EmulatedLink(params.emulate, seed=params.seed * 2) if params.emulate else None
        self._conn_lock = threading.Lock()
        self._live: tuple[Any, Outbox] | None = None
        self._fatal: ChannelError | None = None
        self._closed = threading.Event()
        self._kick_lock = threading.Lock()
        self._connecting = False
        self._keep_open = False  # reconnect even with nothing to send: the server sends first
        self._watchdog = AckWatchdog(lambda: [self._delivery])

    @property
    def emulated_link(self) -> EmulatedLink | None:
        """What shapes this end's sends (None: not emulated): a link degrade retunes it."""
        return self._link

    def connect(self, timeout_s: float | None = None, deadline: float | None = None) -> None:
        self._ensure(
            Deadline.for_call(
                timeout_s, deadline, self.params.deadline_s, what=f"token_ids connect {self.target}"
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
        wait_ack(self._delivery.submit(payload, dl), dl)

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
        fut = self._delivery.submit(payload, dl)
        if self._live is None:
            self._kick()
        return fut

    def keep_open(self) -> None:
        """Connect now, in the background, and stay connected (reconnecting after a break) with
        nothing to send: the server end may send first (main tells the relay its KV landed)."""
        if self._keep_open or self._closed.is_set():
            return
        self._keep_open = True
        if self._live is None:
            self._kick()

    def recv(self, timeout_s: float | None = None, deadline: float | None = None) -> Message:
        """The next TokenIds or Control the server sent us."""
        return self._mailbox.get(
            Deadline.for_call(timeout_s, deadline, self.params.deadline_s, what="token_ids recv")
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
        self._delivery.fail_all(ChannelClosed("token_ids client closed"))
        self._watchdog.stop()
        self._channel.close()

    def __enter__(self) -> TokenIdsClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _deadline(self, payload: Any, timeout_s: float | None, deadline: float | None) -> Deadline:
        return Deadline.for_call(
            timeout_s,
            deadline,
            self.params.deadline_s,
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
        out = Outbox(self._link)
        out.put(pb.Envelope(hello=pb.Hello(peer=self.name, version=VERSION)))
        self._delivery.attach(out)  # unacknowledged envelopes go right after the Hello
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
            self._delivery.detach(out)
            out.close()
            call.cancel()
            err = state["error"]
            if isinstance(err, ChannelAuthError):
                raise err
            if err is not None and not dl.expired():
                raise err
            raise dl.timeout(f"waiting for {self.target} to answer the handshake")
        self._live = (call, out)

    def _read(self, call: Any, out: Outbox, hello: threading.Event, state: dict) -> None:
        try:
            for env in call:
                if env.WhichOneof("body") == "hello":
                    hello.set()
                    continue
                self._delivery.on_envelope(env)
        except grpc.RpcError as exc:
            state["error"] = rpc_error(exc, self.target)
        finally:
            out.close()
            self._delivery.detach(out)
            if state["error"] is None:
                state["error"] = ChannelClosed(f"token_ids stream to {self.target} ended")
            hello.set()  # before taking the lock: _open may hold it while waiting for this
            with self._conn_lock:
                was_live = self._live is not None and self._live[1] is out
                if was_live:
                    self._live = None
            if isinstance(state["error"], ChannelAuthError):
                self._fatal = state["error"]
                self._delivery.fail_all(state["error"])
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

    def _wanted(self) -> bool:
        return self._keep_open or self._delivery.has_pending()

    def _reconnect(self) -> None:
        """Reopen the stream (in the dead stream's reader thread) while messages await an ack."""
        backoff = 0.05
        while not self._closed.is_set() and self._fatal is None and self._wanted():
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
                self._delivery.fail_all(exc)
                return
            except ChannelError:
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
