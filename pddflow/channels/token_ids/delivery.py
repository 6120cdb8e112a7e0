"""Ordered, acknowledged delivery over a token_ids stream, the same on both ends: per-peer state
that numbers, resends, reorders and acknowledges envelopes and outlives any one gRPC stream."""

from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from pddflow.channels.deadline import Deadline
from pddflow.channels.emulation import EmulatedLink
from pddflow.channels.errors import ChannelError
from pddflow.channels.proto import pddflow_pb2 as pb
from pddflow.channels.token_ids.codec import (
    GRPC_MESSAGE_PREFIX,
    HTTP2_FRAME_HEADER,
    Control,
    Message,
    envelope,
    payload_of,
    seq_of,
)
from pddflow.core.payloads import TokenIds

# what gRPC and HTTP/2 add to each message, counted in its emulated size
_FRAMING = GRPC_MESSAGE_PREFIX + HTTP2_FRAME_HEADER
_SEQ_MEMORY = 1 << 16  # sequences whose receive order is remembered (LRU)


class Outbox:
    """Envelopes for one gRPC stream, each released at its emulated arrival time (at once when
    the link is not emulated)."""

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


class PeerDelivery:
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
        self._outbox: Outbox | None = None

    def submit(self, payload: TokenIds | Control, dl: Deadline) -> Future:
        fut: Future = Future()
        with self._lock:
            seq = payload.seq_id
            msg_no = self._next_no.get(seq, 0)
            self._next_no[seq] = msg_no + 1
            env = envelope(payload, msg_no)
            self._pending[(seq, msg_no)] = (env, fut, dl)
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

    def attach(self, outbox: Outbox) -> None:
        with self._lock:
            self._outbox = outbox
            for env, _, _ in self._pending.values():  # resend in submit order
                outbox.put(env)

    def detach(self, outbox: Outbox) -> None:
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
            expected = self._expect.get(seq, 0)
            if env.msg_no < expected:
                self._ack(seq, env.msg_no, True, "")  # a resend of something delivered: ack again
                return
            if env.msg_no > expected:
                self._held.setdefault(seq, {})[env.msg_no] = env  # early: wait for the gap
                return
            ready = [env]
            held = self._held.get(seq, {})
            while expected + len(ready) in held:
                ready.append(held.pop(expected + len(ready)))
            if not held:
                self._held.pop(seq, None)
            for e in ready:
                ok = self._deliver(Message(self.remote, payload_of(e)))  # type: ignore[arg-type]
                self._ack(seq, e.msg_no, ok, "" if ok else "receiver closed")
            self._expect[seq] = expected + len(ready)
            self._expect.move_to_end(seq)
            while len(self._expect) > _SEQ_MEMORY:
                old, _ = self._expect.popitem(last=False)
                self._held.pop(old, None)

    def _ack(self, seq: str, msg_no: int, ok: bool, error: str) -> None:
        if self._outbox is not None:
            ack = pb.Ack(seq_id=seq, msg_no=msg_no, ok=ok, error=error)
            self._outbox.put(pb.Envelope(ack=ack))


class AckWatchdog:
    """Expires unacknowledged envelopes at their deadlines, so no wait outlives its deadline
    even when nobody is blocked on the future."""

    def __init__(self, peers: Callable[[], list[PeerDelivery]]):
        self._peers = peers
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="token_ids-watchdog")
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for peer in self._peers():
                peer.expire()

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=2)


class Mailbox:
    """What an end has received, waiting for its owner's recv()."""

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


def wait_ack(fut: Future, dl: Deadline) -> None:
    # the watchdog fails the future at the deadline; the margin only covers its 50 ms tick
    try:
        fut.result(timeout=dl.remaining() + 0.5)
    except FutureTimeout:
        raise dl.timeout("waiting for the ack") from None
