"""A worker's receivers, senders (made on first use) and report stream; what arrives goes on the
inbox the compute loop drains, and nothing here touches the engine."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pddflow.channels.emulation import degraded
from pddflow.channels.errors import ChannelClosed, ChannelError, ChannelTimeout
from pddflow.channels.rdma_tensor.protocol import SharedMemoryKVParams
from pddflow.channels.rdma_tensor.receiver import SharedMemoryKVReceiver
from pddflow.channels.rdma_tensor.sender import SharedMemoryKVSender
from pddflow.channels.security import TLSConfig
from pddflow.channels.token_ids.client import TokenIdsClient
from pddflow.channels.token_ids.codec import Control, ControlKind
from pddflow.channels.token_ids.protocol import TokenIdsParams
from pddflow.channels.token_ids.server import TokenIdsServer
from pddflow.channels.wan_flight.params import WanFlightParams
from pddflow.channels.wan_flight.receiver import WanFlightReceiver
from pddflow.channels.wan_flight.sender import WanFlightSender
from pddflow.core.channel_kinds import Kind
from pddflow.core.link import Jitter, LinkModel
from pddflow.core.payloads import TokenIds
from pddflow.graph.plan import ChannelPlan, Plan
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.rpc import API_SERVER, FRONTEND, open_reports
from pddflow.runtime.transports import SHM, incoming, pair
from pddflow.runtime.wiring import Wiring, rdma_address
from pddflow.runtime.workers.inbox import (
    Abort,
    CaughtUp,
    HandoffTokens,
    KVArrived,
    KVLost,
    MainLanded,
)
from pddflow.runtime.workers.report_queue import ReportQueue

POLL_S = 0.2  # receive loops wake this often to notice shutdown
# the channel kinds this runtime opens
TRANSPORTS = (Kind.RDMA_TENSOR, Kind.WAN_FLIGHT, Kind.TOKEN_IDS)


class WorkerIO:
    def __init__(self, wiring: Wiring, plan: Plan, instance: str, inbox: queue.Queue):
        self.wiring, self.plan, self.instance, self.inbox = wiring, plan, instance, inbox
        self.operator = plan.instance(instance).operator
        self.credentials = wiring.credentials()
        self.closed = threading.Event()
        # set when a report stream opens: the worker sends its whole cache listing
        self.resync = threading.Event()
        self.resync.set()
        self.reports = ReportQueue()
        # the sequences' tokens of the step in progress, sent as one report (`flush`); a report
        # of anything else sends them first, so the stream keeps the order things happened in
        # this step's tokens by where they go: "" the router, else an API process (reply_to)
        self._tokens: dict[str, list[pb.Tokens]] = {}
        self._api_reports: dict[str, ReportQueue] = {}  # an API process's own report stream
        self._reopened: set[str] = set()  # streams ("" the router's) that broke and reopened
        self._report_lock = threading.Lock()
        self._senders: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        # what each link is emulated as now: as declared until the admin endpoint degrades it
        self.links: dict[str, LinkModel] = dict(plan.links)
        self._shaped: list[tuple[ChannelPlan, Any]] = []  # the channel ends whose sends it shapes
        ep = wiring.workers[instance]
        self.kv_receivers: list[Any] = []
        self.handoff_server: TokenIdsServer | None = None
        for ch in plan.channels:
            if ch.dst != self.operator:
                continue
            if ch.kind not in TRANSPORTS:
                raise ChannelError(
                    f"{instance}: channel {ch.id} is of kind {ch.kind!r}, which this runtime "
                    f"cannot open (it has {', '.join(TRANSPORTS)})"
                )
            if ch.kind == Kind.RDMA_TENSOR and not any(
                isinstance(r, SharedMemoryKVReceiver) for r in self.kv_receivers
            ):
                self.kv_receivers += rdma_receivers(wiring, ch, instance, 0)
            elif ch.kind == Kind.WAN_FLIGHT and not any(
                isinstance(r, WanFlightReceiver) for r in self.kv_receivers
            ):
                port = int(ep.kv_flight.rsplit(":", 1)[1])
                self.kv_receivers.append(
                    WanFlightReceiver(
                        wiring.bind_host(ep.kv_flight),
                        port,
                        params=self._flight_params(ch),
                    )
                )
            elif ch.kind == Kind.TOKEN_IDS and self.handoff_server is None:
                port = int(ep.handoff.rsplit(":", 1)[1])
                self.handoff_server = TokenIdsServer(
                    wiring.bind_host(ep.handoff), port, params=self._token_params(ch), name=instance
                )
                self._shaped.append((ch, self.handoff_server))
        for r in self.kv_receivers:
            threading.Thread(
                target=self._pump_kv, args=(r,), daemon=True, name=f"kv-{type(r).__name__}"
            ).start()
        if self.handoff_server is not None:
            threading.Thread(
                target=self._pump_tokens,
                args=(self.handoff_server,),
                daemon=True,
                name="handoff-in",
            ).start()
        threading.Thread(target=self._keep_reporting, daemon=True, name="reports").start()

    def _link(self, ch: ChannelPlan):
        if ch.cross_cluster and ch.params["emulate"] and ch.link:
            return self.links[ch.link]
        return None

    def _tls(self, ch: ChannelPlan) -> TLSConfig | None:
        if not ch.params.get("tls"):
            return None
        return self.wiring.tls()

    def _auth(self, ch: ChannelPlan) -> str | None:
        return (ch.params.get("token") or self.wiring.auth_token) if ch.cross_cluster else None

    def _flight_params(self, ch: ChannelPlan) -> WanFlightParams:
        return WanFlightParams(
            streams=ch.params["streams"],
            deadline_s=ch.params["deadline_s"],
            token=self._auth(ch),
            tls=self._tls(ch),
            emulate=self._link(ch),
            seed=self.wiring.seed,
            checksum=ch.params["checksum"],
        )

    def _token_params(self, ch: ChannelPlan) -> TokenIdsParams:
        return TokenIdsParams(
            deadline_s=ch.params["deadline_s"],
            token=self._auth(ch),
            tls=self._tls(ch),
            emulate=self._token_link(self._link(ch)),
            seed=self.wiring.seed,
        )

    @staticmethod
    def _token_link(link: LinkModel | None) -> LinkModel | None:
        # jitter models bulk KV queueing on a busy WAN; token IDs see the RTT (PDD: std 4.8 ms)
        return replace(link, jitter=Jitter()) if link is not None else None

    def tune_link(self, tuning: pb.LinkTuning) -> pb.LinkTuned:
        """The admin endpoint's degrade or restore of one link: this worker's emulated senders of
        it shape by the new model from their next piece, and senders made later start with it.
        Runs on an RPC thread; each EmulatedLink takes its own lock."""
        declared = self.plan.links.get(tuning.link)
        if declared is None:
            raise ValueError(f"{self.instance}: no link {tuning.link!r} in the plan")
        model = declared
        if not tuning.restore:
            p99 = tuning.jitter_p99_ms if tuning.HasField("jitter_p99_ms") else None
            model = degraded(declared, tuning.gbps, p99)
        shaped = 0
        with self._lock:  # no sender is made from the old model meanwhile
            self.links[tuning.link] = model
            for ch, end in self._shaped:
                link = end.emulated_link
                if ch.link != tuning.link or link is None:
                    continue
                link.retune(self._token_link(model) if ch.kind == Kind.TOKEN_IDS else model)
                shaped += 1
        return pb.LinkTuned(instance=self.instance, shaped=shaped)

    # one sender per (channel, destination instance[, its rank])
    def sender(self, kind: str, dst_instance: str, rank: int = 0) -> Any:
        key = (kind, dst_instance) if not rank else (kind, f"{dst_instance}#{rank}")
        with self._lock:
            if key in self._senders:
                return self._senders[key]
            ch = self._channel(kind, dst_instance)
            ep = self.wiring.workers[dst_instance]
            if kind == Kind.RDMA_TENSOR:
                s = rdma_sender(self.wiring, ch, self.instance, dst_instance, rank)
            elif kind == Kind.WAN_FLIGHT:
                params = self._flight_params(ch)
                target = self.wiring.reach(ep.kv_flight)
                if params.tls is not None:
                    target = target.replace("grpc://", "grpc+tls://", 1)
                s = WanFlightSender(target, params=params)
            else:
                s = TokenIdsClient(
                    self.wiring.reach(ep.handoff), params=self._token_params(ch), name=self.instance
                )
                threading.Thread(
                    target=self._pump_tokens, args=(s,), daemon=True, name="handoff-back"
                ).start()
            self._senders[key] = s
            if self._link(ch) is not None:
                self._shaped.append((ch, s))
            return s

    def _channel(self, kind: str, dst_instance: str) -> ChannelPlan:
        return channel_to(self.plan, self.instance, kind, dst_instance)

    def deadline_s(self, kind: str, dst_instance: str) -> float:
        return float(self._channel(kind, dst_instance).params["deadline_s"])

    def kv_kind_to(self, dst_instance: str) -> str:
        dst_op = self.plan.instance(dst_instance).operator
        for c in self.plan.channels_between(self.operator, dst_op):
            if c.payload == "KVBlocks":
                return c.kind
        raise ChannelError(
            f"{self.instance}: the plan has no KV edge from {self.operator} to {dst_op}"
        )

    def _pump_kv(self, receiver: Any) -> None:
        pump_kv(
            receiver,
            self.closed,
            lambda kv: self.inbox.put(KVArrived(kv, time.monotonic())),
            # a transfer that failed at the receiver: the leg decides
            lambda exc: self.inbox.put(KVLost(getattr(exc, "seq_id", ""), str(exc))),
        )

    def _pump_tokens(self, endpoint: Any) -> None:
        while not self.closed.is_set():
            try:
                msg = endpoint.recv(timeout_s=POLL_S)
            except ChannelTimeout:
                continue
            except ChannelError:
                if self.closed.is_set():
                    return
                time.sleep(POLL_S)
                continue
            if isinstance(msg.payload, TokenIds):
                self.inbox.put(HandoffTokens(msg.peer, msg.payload))
            elif msg.payload.kind == ControlKind.RELEASE:
                self.inbox.put(CaughtUp(msg.payload.seq_id))
            elif msg.payload.kind == ControlKind.LANDED:
                self.inbox.put(MainLanded(msg.payload.seq_id))
            elif msg.payload.kind == ControlKind.CANCEL:
                reason = msg.payload.reason or "cancelled by peer"
                self.inbox.put(Abort(msg.payload.seq_id, reason))

    def release(self, peer: str, seq_id: str, timeout_s: float) -> None:
        """Main tells the relay it has caught up, back on the handoff stream."""
        self._to_relay(peer, Control(ControlKind.RELEASE, seq_id), timeout_s)

    def landed(self, peer: str, seq_id: str, timeout_s: float) -> None:
        """Main tells the relay the prompt's KV has landed here: the relay hands over. Queued
        until the relay's stream is open (it opens it when its leg starts: `open_handoff`)."""
        self._to_relay(peer, Control(ControlKind.LANDED, seq_id), timeout_s)

    def _to_relay(self, peer: str, msg: Control, timeout_s: float) -> None:
        assert self.handoff_server is not None
        self.handoff_server.send_async(peer, msg, timeout_s=timeout_s)

    def open_handoff(self, main: str) -> None:
        """The relay's stream to main, open before it has anything to send: main speaks first
        when its KV lands."""
        self.sender(Kind.TOKEN_IDS, main).keep_open()

    def tokens(self, tokens: pb.Tokens, reply_to: str = "") -> None:
        """A sequence's new tokens, sent with the rest of the step's (`flush`) to the router, or
        straight to the API process holding the request's connection (`reply_to`)."""
        with self._report_lock:
            self._tokens.setdefault(reply_to, []).append(tokens)

    def flush(self) -> None:
        """The step's tokens, one report per destination."""
        with self._report_lock:
            self._flush_tokens()

    def _flush_tokens(self) -> None:
        for to, tokens in self._tokens.items():
            report = pb.Report(instance=self.instance, tokens=pb.TokenBatch(tokens=tokens))
            (self._api_queue(to) if to else self.reports).put(report)
        self._tokens.clear()

    def _api_queue(self, name: str) -> ReportQueue:
        """The report stream to API process `name`, opened on its first tokens."""
        q = self._api_reports.get(name)
        if q is None:
            if name not in self.wiring.api_servers:
                raise ChannelError(f"{self.instance}: no API process {name!r} in the wiring")
            q = self._api_reports[name] = ReportQueue()
            threading.Thread(
                target=self._keep_reporting, args=(name,), daemon=True, name=f"to-{name}"
            ).start()
        return q

    def report(self, **body: Any) -> None:
        with self._report_lock:  # (any thread: channel callbacks report too)
            self._flush_tokens()
            self.reports.put(pb.Report(instance=self.instance, **body))

    def event(
        self,
        seq_id: str,
        kind: pb.EventKind.ValueType,
        channel: str = "",
        peer: str = "",
        **values: float,
    ) -> None:
        at = time.time()
        event = pb.Event(
            seq_id=seq_id, kind=kind, t_unix=at, values=values, channel=channel, peer=peer
        )
        self.report(event=event)

    def fail(
        self,
        seq_id: str,
        kind: pb.FailureKind.ValueType,
        error: str,
        peer: str = "",
        channel: str = "",
    ) -> None:
        failure = pb.Failure(seq_id=seq_id, kind=kind, error=error, peer=peer, channel=channel)
        self.report(failure=failure)

    def _keep_reporting(self, api: str = "") -> None:
        """Hold a report stream open (to the router, or to API process `api`); if it breaks
        while the other end lives, open it again."""
        cluster = self.plan.instance(self.instance).cluster
        if api:
            to, service, source = (
                self.wiring.api_from(cluster, api),
                API_SERVER,
                self._api_reports[api],
            )
        else:
            to, service, source = self.wiring.frontend_from(cluster), FRONTEND, self.reports
        first = True
        while not self.closed.is_set():
            # what the broken stream had taken may be lost: the cache listing and the legs'
            # tokens are told again (the loop's `retell`)
            if not first:
                if not api:
                    self.resync.set()
                with self._report_lock:
                    self._reopened.add(api)
            first = False
            messages, ended = source.stream(self.closed, POLL_S)
            fut = open_reports(to, messages, self.credentials, service)
            fut.add_done_callback(lambda _, e=ended: e.set())
            while not (self.closed.is_set() or fut.done()):
                time.sleep(POLL_S)
            if not self.closed.is_set():
                time.sleep(POLL_S)

    def reopened(self) -> set[str]:
        """The report streams ("" the router's, else an API process's) that reopened since the
        last call."""
        with self._report_lock:
            got, self._reopened = self._reopened, set()
        return got

    def close(self) -> None:
        self.closed.set()
        for s in self._senders.values():
            try:
                s.close()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
        for r in self.kv_receivers:
            r.close()
        if self.handoff_server is not None:
            self.handoff_server.close()


def rdma_params(wiring: Wiring, ch: ChannelPlan, transport: str) -> SharedMemoryKVParams:
    return SharedMemoryKVParams(
        ring_slots=ch.params["ring_slots"],
        slot_mb=ch.params["slot_mb"],
        arena_mb=ch.params["arena_mb"],
        deadline_s=ch.params["deadline_s"],
        checksum=ch.params["checksum"] or None,
        transport=transport,
        # a network receiver listens on the node's address: the deployment's token keeps
        # whoever else reaches it out (a unix socket is this host's alone)
        token=wiring.auth_token if transport != SHM else None,
    )


def rdma_receivers(wiring: Wiring, ch: ChannelPlan, instance: str, rank: int) -> list[Any]:
    """One receiver per way the instance's senders reach it (`transports.py`), at `rank`'s
    addresses."""
    ep = wiring.workers[instance]
    out: list[Any] = []
    if ep.kv_rdma:
        unix = rdma_address(ep, rank, SHM)
        out.append(SharedMemoryKVReceiver(unix, params=rdma_params(wiring, ch, SHM)))
    if ep.kv_rdma_net:
        kinds = incoming(wiring.rdma, instance) - {SHM}
        transport = kinds.pop() if len(kinds) == 1 else "auto"
        net = rdma_address(ep, rank, "tcp")
        port = net.rsplit(":", 1)[1]
        bind = f"tcp:{wiring.bind_host(net[4:])}:{port}"
        out.append(SharedMemoryKVReceiver(bind, params=rdma_params(wiring, ch, transport)))
    return out


def rdma_sender(
    wiring: Wiring, ch: ChannelPlan, src: str, dst: str, rank: int
) -> SharedMemoryKVSender:
    """To rank `rank` of dst: shared memory where dst shares src's host, its network address
    otherwise."""
    transport = wiring.rdma.get(pair(src, dst), SHM)
    address = rdma_address(wiring.workers[dst], rank, transport)
    return SharedMemoryKVSender(address, params=rdma_params(wiring, ch, transport))


def channel_to(plan: Plan, src_instance: str, kind: str, dst_instance: str) -> ChannelPlan:
    """The plan's `kind` edge from src_instance's operator to dst_instance's."""
    src_op = plan.instance(src_instance).operator
    dst_op = plan.instance(dst_instance).operator
    for c in plan.channels:
        if c.src == src_op and c.dst == dst_op and c.kind == kind:
            return c
    raise ChannelError(f"{src_instance}: the plan has no {kind} edge from {src_op} to {dst_op}")


def pump_kv(
    receiver: Any,
    closed: threading.Event,
    arrived: Callable[[Any], None],
    failed: Callable[[ChannelError], None],
) -> None:
    """Hand each KV set a receiver completes to `arrived`, each it failed to `failed`, until
    `closed` is set or the receiver closes."""
    while not closed.is_set():
        try:
            kv = receiver.recv(timeout_s=POLL_S)
        except ChannelTimeout:
            continue
        except ChannelClosed:
            return
        except ChannelError as exc:
            failed(exc)
            continue
        arrived(kv)
