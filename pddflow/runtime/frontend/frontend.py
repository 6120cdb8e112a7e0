"""The frontend: the deployment's router (docs/runtime.md, A request, step by step). Reports arrive
on gRPC threads; all request state is touched only on the asyncio loop."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

from pddflow.core.block_hash import chain_block_hashes
from pddflow.core.operator_types import OPERATOR_TYPES
from pddflow.core.payloads import SamplingParams
from pddflow.graph.plan import Plan
from pddflow.runtime.api.errors import RequestRejected
from pddflow.runtime.api.logprobs import from_tokens
from pddflow.runtime.frontend.accounting import Accounting
from pddflow.runtime.frontend.fallbacks import Fallbacks
from pddflow.runtime.frontend.link_watch import LinkWatch
from pddflow.runtime.frontend.metrics import Metrics
from pddflow.runtime.frontend.model_info import ModelInfo
from pddflow.runtime.frontend.route import HANDOFF_MODES, RESUMED, Live, Route, mode_name
from pddflow.runtime.frontend.token_stream import RequestState, StreamConflict, TokenRun
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.rpc import FRONTEND, WorkerClient, as_concurrent, grpc_text, serve
from pddflow.runtime.wiring import Wiring
from pddflow.scheduler import (
    InstanceLoad,
    MirrorDrift,
    RequestFeatures,
    SchedulerState,
    make_policy,
)
from pddflow.scheduler.prefill_rate import PrefillRate

log = logging.getLogger("pddflow.frontend")
TIMELINES_KEPT = 1000


def event_name(kind: pb.EventKind.ValueType) -> str:
    return pb.EventKind.Name(kind).removeprefix("EVENT_").lower()


class Frontend(Fallbacks, Accounting):
    def __init__(
        self, plan: Plan, wiring: Wiring, model: ModelInfo, metrics: Metrics | None = None
    ):
        self.plan, self.wiring = plan, wiring
        self.model_id = plan.name
        self.tokenizer = model.tokenizer
        self.chat_prompt_ids = model.chat_prompt_ids  # a chat's prompt, templated and tokenized
        self.vocab_size = model.vocab_size
        self.max_context = min(model.max_context, plan.model.max_context)
        self.metrics = metrics or Metrics()
        self.policy = make_policy(plan)
        self.sched = SchedulerState.for_plan(plan)
        self.link_watch = LinkWatch(plan, self.sched, self.metrics)
        self.prefill_rates = {
            i.id: PrefillRate()
            for i in plan.instances
            if OPERATOR_TYPES.get(plan.operators[i.operator].op_type).entry
        }
        self.credentials = wiring.credentials()
        self.clients = {
            i: WorkerClient(ep.rpc, self.credentials) for i, ep in wiring.workers.items()
        }
        self.status: dict[str, pb.WorkerStatus] = {}
        self.metrics.watch_workers(self.status)
        self.metrics.watch_deployment(self.model_id, self._vllm_gauges)
        self.lost: set[str] = set()
        self.drift: list[str] = []
        self.live: dict[str, Live] = {}
        self.resumed: dict[str, str] = {}  # a resumed request's sequence id -> its request id
        # ended requests, kept for their timelines; a leg that outlives the request (main's KV
        # landing after the relay finished) still adds its events here
        self.done: OrderedDict[str, RequestState] = OrderedDict()
        # ended requests whose main still extends over the relay's IDs (its cache keeps the turn)
        self.lingering: OrderedDict[str, Route] = OrderedDict()
        self.orphans: dict[str, dict[str, float]] = {}  # instance -> {seq_id: first seen ended}
        self.restarts: dict[str, int] = {}  # instance -> restarts by the deployer
        self.exits: dict[str, str] = {}  # instance -> why it last died
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self.server, _ = serve(
            FRONTEND,
            self.credentials,
            streams_in={"Reports": (pb.Report, pb.Empty, self._reports)},
            port=int(wiring.frontend.rsplit(":", 1)[1]),
            host=wiring.bind_host(wiring.frontend),
            threads=len(wiring.workers) + 8,
        )

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self.loop = loop

    def health(self) -> tuple[bool, dict[str, Any]]:
        workers = {i: self._worker_health(i) for i in self.wiring.workers}
        ready = all(w["ready"] for w in workers.values())
        down = [i for i, w in workers.items() if w["state"] == "lost"]
        return ready, {
            "status": "ready" if ready else ("degraded" if down else "starting"),
            "workers": workers,
            "live_requests": len(self.live),
            "max_tokens_in_flight": self.max_serving_tokens(),
            "mirror_drift": self.drift,
            "links": self.link_watch.report(),
            "kv_bytes_per_token": self.policy.kv_bytes_per_token,  # what transfers are sized by
            "prefill_ms_per_1k_tokens": {
                i: round(self.sched.prefill_s_per_token.get(i, 0.0) * 1e6, 3)
                for i in self.prefill_rates
            },
        }

    def _worker_health(self, inst: str) -> dict[str, Any]:
        s = self.status.get(inst)
        state = "lost" if inst in self.lost else ("up" if s is not None and s.ready else "starting")
        out: dict[str, Any] = {"ready": state == "up", "state": state}
        if state == "up":
            out.update(
                kv_blocks_used=s.kv_blocks_used,
                cached_blocks=s.cached_blocks,
                running=s.running,
                legs=len(s.legs),
            )
        if inst in self.restarts or inst in self.exits:
            out.update(restarts=self.restarts.get(inst, 0), last_exit=self.exits.get(inst))
        return out

    def metrics_text(self) -> tuple[bytes, str]:
        self.link_watch.refresh()
        return self.metrics.render()

    def stopped(self, request_id: str) -> None:
        live = self.live.get(request_id)
        if live is not None:
            live.state.finish_reason = "stop"

    def timeline(self, request_id: str) -> dict[str, Any] | None:
        live = self.live.get(request_id)
        st = live.state if live else self.done.get(request_id)
        return st.timeline() if st else None

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        deadline: float,
        variant: str | None,
        handoff: str | None,
    ) -> AsyncIterator[list[int]]:
        if sampling.seed is None:  # every leg must draw the same randomness at each position
            sampling = replace(sampling, seed=random.getrandbits(63))
        route = self._route(request_id, prompt_ids, sampling, variant, handoff)
        st = RequestState(
            request_id,
            len(prompt_ids),
            sampling.max_tokens,
            route.decision.variant,
            mode_name(route.handoff),
        )
        live = Live(st, route, prompt_ids, sampling, deadline)
        self.live[request_id] = live
        st.event(
            "arrival",
            variant=route.decision.variant,
            reason=route.decision.reason,
            predicted_hit=round(route.decision.predicted_hit, 4),
            predicted_hit_tokens=route.decision.predicted_hit_tokens,
        )
        try:
            await self._submit(live)
            while True:
                new = st.take_new()
                if new:
                    yield new
                if st.finished and st.emitted == len(st.tokens):
                    break
                if st.error:
                    raise RequestRejected(502, st.error)
                left = deadline - time.monotonic()
                if left <= 0:
                    st.fail("deadline passed")
                    raise RequestRejected(504, f"request {request_id} passed its deadline")
                st.wakeup.clear()  # reports land on this loop: nothing can slip in before the wait
                try:
                    await asyncio.wait_for(st.wakeup.wait(), timeout=min(left, 1.0))
                except TimeoutError:
                    pass
            if st.error:
                raise RequestRejected(502, st.error)
        finally:
            self._close(live)

    def _route(
        self,
        rid: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        variant: str | None,
        handoff: str | None,
    ) -> Route:
        bs = self.plan.model.block_size
        feats = RequestFeatures(
            rid, len(prompt_ids), tuple(chain_block_hashes(prompt_ids, bs)), sampling.max_tokens, bs
        )
        self.link_watch.refresh()  # the links as measured now
        self._count_entry_queues()
        if variant is not None:
            if variant not in self.plan.variants:
                raise RequestRejected(
                    400,
                    f"unknown variant {variant!r}; this deployment has "
                    f"{', '.join(self.plan.variants)}",
                )
            decision = self.policy.build(
                self.policy.topo.paths[variant],
                feats,
                self.sched,
                reason="variant forced by the request",
            )
        else:
            decision = self.policy.decide(feats, self.sched)
        route = Route.of(
            self.plan,
            self._around_lost(decision, feats),
            handoff,
            self.policy.params.get("catch_up_load", 0.0),
        )
        self._admit(route, len(prompt_ids), sampling.max_tokens)
        return route

    async def _submit(self, live: Live) -> None:
        r = live.route
        targets = [
            i
            for i in (r.prefill, r.relay, r.main)
            if i and not (i == r.main and r.decision.singular)
        ]
        job = live.job(self.plan)
        futs = [(i, self.clients[i].future("Submit", job)) for i in targets]
        r.legs.update(targets)
        for inst, fut in futs:
            try:
                await asyncio.wrap_future(as_concurrent(fut))
            except Exception as exc:  # noqa: BLE001 - a dead worker: the request cannot start
                raise RequestRejected(
                    503, f"worker {inst} did not take the request: {grpc_text(exc)}"
                ) from None

    def _reports(self, stream: Iterator[pb.Report], context: Any) -> pb.Empty:
        instance = None
        try:
            for rep in stream:
                instance = rep.instance
                self._dispatch(self._on_report, rep)
        except Exception:  # noqa: BLE001 - the worker's connection broke
            pass
        if instance is not None and not self._answers(instance):
            self._dispatch(self._on_worker_lost, instance)
        return pb.Empty()

    def _answers(self, instance: str) -> bool:
        """A broken report stream alone is not a lost worker: it reconnects if it still runs."""
        try:
            self.clients[instance].call("Status", pb.Empty(), timeout_s=2.0)
            return True
        except Exception:  # noqa: BLE001 - any failure to answer counts as gone
            return False

    def _dispatch(self, fn: Any, arg: Any) -> None:
        with self._lock:  # before the server's loop exists (startup), reports are applied here
            if self.loop is None:
                fn(arg)
                return
        try:
            self.loop.call_soon_threadsafe(fn, arg)
        except RuntimeError:  # the loop has closed: shutting down
            pass

    def _on_report(self, rep: pb.Report) -> None:
        which = rep.WhichOneof("body")
        if which == "status":
            self._on_status(rep.instance, rep.status)
        elif which == "cache":
            m = self.sched.mirror(rep.instance)
            if m is not None:
                try:
                    if rep.cache.full:
                        m.reset(rep.cache.inserted)
                        return
                    m.on_evict(rep.cache.evicted)
                    m.on_insert(rep.cache.inserted)
                except MirrorDrift as exc:
                    self._drift(str(exc))
        elif which == "tokens":
            self._on_tokens(rep.instance, rep.tokens)
        elif which == "event":
            self._on_event(rep.instance, rep.event)
        elif which == "failure":
            self._on_failure(rep.instance, rep.failure)

    def _on_status(self, inst: str, s: pb.WorkerStatus) -> None:
        self.status[inst] = s
        if s.kv_bytes_per_token:  # transfers are sized by the KV the served model moves
            self.policy.kv_bytes_per_token = s.kv_bytes_per_token
        self._reap_orphans(inst, s.legs)
        if inst in self.lost and s.ready:
            self._on_worker_back(inst)
        elif s.ready:
            self.metrics.worker_up.labels(inst).set(1)
        op = self.plan.operator_of(inst)
        self.sched.set_load(
            inst,
            InstanceLoad(
                running=s.running,
                queued=s.waiting,
                max_batch=op.max_batch,
                kv_used=s.kv_blocks_used / max(s.kv_blocks_total, 1),
            ),
        )
        self.metrics.queue_depth.labels(inst).set(s.running + s.waiting)
        self.metrics.kv_blocks_used.labels(inst).set(s.kv_blocks_used)
        self.metrics.kv_blocks_total.labels(inst).set(s.kv_blocks_total)
        m = self.sched.mirror(inst)
        # deltas precede the status on the same ordered stream: they must agree now
        if m is not None:
            if len(m) != s.cached_blocks or m.digest != s.cache_digest:
                self._drift(f"{inst}: mirror holds {len(m)} blocks, cache {s.cached_blocks}")

    def _drift(self, msg: str) -> None:
        if msg not in self.drift:
            self.drift.append(msg)
            log.error("radix mirror drift: %s", msg)

    def _live(self, seq_id: str) -> Live | None:
        return self.live.get(self.resumed.get(seq_id, seq_id))

    def _on_tokens(self, inst: str, t: pb.Tokens) -> None:
        live = self._live(t.seq_id)
        if live is None:
            return
        st, r = live.state, live.route
        op = self.plan.instance(inst).operator
        before = len(st.tokens)
        if self.plan.operators[op].op_type == "prefill":
            # prefill's first token reaches the client via the decoder that continues from it
            r.legs.discard(inst)
            r.first_fed = True
            if not t.final:
                self._feed_first(live, t)
                return
            st.add(TokenRun(int(t.start), list(t.ids), op, final=True, logprobs=from_tokens(t)))
        else:
            try:
                st.add(TokenRun(int(t.start), list(t.ids), op, t.final, from_tokens(t)))
            except StreamConflict as exc:
                st.fail(str(exc))
                return
            if t.final:
                r.legs.discard(inst)
        new = len(st.tokens) - before
        if new:
            is_relay = self.plan.operators[op].op_type == "relay_decode"
            self.metrics.count_tokens(op, new, is_relay)
            gap = None
            if before == 0:
                ttft = st.token_times[0] - st.arrival
                self.metrics.ttft.observe(ttft)
                self.metrics.vllm.first_token(ttft, st.prompt_len)
                st.event("first_token", instance=inst)
            elif len(st.token_times) > new:
                gap = st.token_times[-1] - st.token_times[-new - 1]
                self.metrics.itl.observe(gap)
            self.metrics.vllm.tokens(new, gap)

    def _feed_first(self, live: Live, t: pb.Tokens) -> None:
        """Prefill's first token, with its log probabilities (the decoder reports them on)."""
        r = live.route
        target = r.relay if r.relay else r.main
        if target:
            first = pb.Tokens(seq_id=live.state.request_id, start=0, ids=t.ids[:1])
            first.logprobs.extend(t.logprobs[:1])
            first.top.extend(t.top[:1])
            self._call(target, "Feed", first)

    def _on_event(self, inst: str, e: pb.Event) -> None:
        live = self._live(e.seq_id)
        if e.kind in (pb.EVENT_KV_SEND, pb.EVENT_KV_SENT):
            self._count_transfer(inst, e)
            if e.kind == pb.EVENT_KV_SEND and live is not None:
                self._count_prefill(inst, live, e)
        elif e.kind == pb.EVENT_EXTEND_DONE and e.values.get("final"):
            # main has the turn: its leg is over (the request may have ended: main lingered)
            route = live.route if live is not None else self.lingering.get(e.seq_id)
            self.lingering.pop(e.seq_id, None)
            if route is not None and route.handoff_asked and inst == route.main:
                seconds = time.monotonic() - route.handoff_asked
                self.metrics.handoff.labels(mode_name(route.handoff) or "none").observe(seconds)
                route.handoff_asked = 0.0
        # an ended request's timeline still takes its legs' late events
        request_id = self.resumed.get(e.seq_id, e.seq_id)
        st = live.state if live is not None else self.done.get(request_id)
        if st is not None:
            where = {"channel": e.channel, "peer": e.peer} if e.peer else {}
            st.event(event_name(e.kind), instance=inst, **where, **dict(e.values))
        if live is None:
            return
        r = live.route
        if e.kind in (pb.EVENT_KV_LANDED, pb.EVENT_KV_RECOMPUTED):
            r.landed.add(inst)
        main_landed = e.kind == pb.EVENT_KV_LANDED and inst == r.main
        if main_landed and r.relay and r.handoff and not live.state.finished:
            self._start_handoff(live, e.seq_id)
        elif e.kind == pb.EVENT_HANDOFF_SENT and inst == r.relay:
            r.handed_off = True
            if e.values.get("switched"):  # busy between catch-up batches: the rest at once
                r.handoff = pb.HANDOFF_ONE_SHOT
                self.metrics.handoff_switches.inc()

    def _start_handoff(self, live: Live, seq_id: str) -> None:
        """Main has the prompt's KV: the relay hands it the IDs. An adaptive handoff's mode is
        decided now, from the relay's load as it is now (not as it was at arrival)."""
        r = live.route
        if r.adaptive:
            path = self.policy.topo.paths[r.decision.variant]
            r.handoff = HANDOFF_MODES[self.policy.handoff_mode(path, r.relay, self.sched)]
        live.state.event("handoff_start", mode=mode_name(r.handoff), adaptive=r.adaptive)
        r.handoff_asked = time.monotonic()
        self._call(r.relay, "Handoff", pb.StartHandoff(seq_id=seq_id, mode=r.handoff))

    def _abort_leg(self, live: Live, inst: str, reason: str) -> None:
        live.route.legs.discard(inst)
        if inst not in self.lost:
            r = live.route
            seq_id = r.resumed_seq if inst in r.resumed_on else live.state.request_id
            self._call(inst, "Abort", pb.Cancel(seq_id=seq_id, reason=reason))

    def _close(self, live: Live) -> None:
        st, r = live.state, live.route
        ok = st.finished and not st.error
        reason = "finished" if ok else (st.error or "client went away")
        if st.finish_reason == "stop" and not ok:
            reason = "its output hit a stop string"
        for inst in list(r.legs):
            # main still extends over the relay's IDs to keep its cache; it ends the leg itself
            if ok and inst == r.main and r.relay and not r.decision.singular:
                r.ended = time.monotonic()
                self.lingering[st.request_id] = r
                continue
            self._abort_leg(live, inst, reason)
        finish = self._finish_reason(live)
        outcome = {"error": "error", "abort": "cancelled"}.get(finish, "ok")
        if outcome == "ok":  # how long outputs of this prompt size run (singular traffic)
            self.policy.finished(st.prompt_len, len(st.tokens))
        handoff = mode_name(r.handoff) or "none"
        self.metrics.requests.labels(r.decision.variant, handoff, outcome).inc()
        e2e = time.monotonic() - st.arrival
        self.metrics.e2e.observe(e2e)
        times = st.token_times
        decode = times[-1] - times[0] if times else None
        self.metrics.vllm.finished(finish, e2e, decode, st.prompt_len, len(st.tokens))
        self.live.pop(st.request_id, None)
        self.done[st.request_id] = st
        while len(self.done) > TIMELINES_KEPT:
            request_id, _ = self.done.popitem(last=False)
            self.resumed.pop(f"{request_id}{RESUMED}", None)
            self.lingering.pop(request_id, None)

    @staticmethod
    def _finish_reason(live: Live) -> str:
        """vLLM's: `stop` (a stop token, or a stop string the API found), `length` (max_tokens),
        `abort` (the client went away, a drain), `error`."""
        st = live.state
        if st.error:
            return "error"
        if st.finish_reason:
            return st.finish_reason
        if not st.finished:
            return "abort"
        stops = live.sampling.stop_token_ids
        if len(st.tokens) < st.max_tokens or (st.tokens and st.tokens[-1] in stops):
            return "stop"
        return "length"

    def _call(self, inst: str, method: str, msg: Any) -> None:
        if inst in self.lost:
            return
        fut = self.clients[inst].future(method, msg)
        fut.add_done_callback(
            lambda f: (
                f.exception()
                and log.warning("%s.%s failed: %s", inst, method, grpc_text(f.exception()))
            )
        )

    def close(self) -> None:
        self.server.stop(grace=0.5)
        for c in self.clients.values():
            c.close()
