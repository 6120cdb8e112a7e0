"""The frontend: the deployment's router (docs/runtime.md, A request, step by step). Reports arrive
on gRPC threads; all flight state is touched only on the asyncio loop."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

from pddflow.core.block_hash import chain_block_hashes
from pddflow.core.payloads import SamplingParams
from pddflow.graph.plan import OperatorPlan, Plan
from pddflow.runtime.frontend.accounting import Accounting
from pddflow.runtime.frontend.api_servers import ApiServers, count_remote, ended_remotely, rejection
from pddflow.runtime.frontend.fallbacks import Fallbacks
from pddflow.runtime.frontend.fleet import Fleet
from pddflow.runtime.frontend.flight import Flight, Flights, cached_tokens, finish_reason
from pddflow.runtime.frontend.leases import Leases
from pddflow.runtime.frontend.link_watch import LinkWatch
from pddflow.runtime.frontend.loop_batches import LoopBatches
from pddflow.runtime.frontend.loop_call import call_on_loop
from pddflow.runtime.frontend.metrics import Metrics
from pddflow.runtime.frontend.model_info import ModelInfo
from pddflow.runtime.frontend.pools import PlannerView, Pools
from pddflow.runtime.frontend.rejection import RequestRejected
from pddflow.runtime.frontend.reports import StatusReports
from pddflow.runtime.frontend.route import Route, mode_name
from pddflow.runtime.frontend.token_stream import (
    StreamConflict,
    TokenRun,
    TokenStream,
    stream_chunks,
)
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.rpc import CALL_TIMEOUT_S, FRONTEND, grpc_text, serve
from pddflow.runtime.wire import logprobs_from_pb, sampling_from_pb
from pddflow.runtime.wiring import Wiring
from pddflow.scheduler import RequestFeatures, SchedulerState, make_policy

log = logging.getLogger("pddflow.frontend")


def event_name(kind: pb.EventKind.ValueType) -> str:
    return pb.EventKind.Name(kind).removeprefix("EVENT_").lower()


def handoff_start(e: pb.Event) -> dict[str, Any]:
    """The relay's handoff_started event as the timeline shows it: the mode it chose, whether
    it chose (adaptive) and from what load."""
    v = e.values
    return {
        "mode": mode_name(int(v["mode"])),
        "adaptive": bool(v.get("adaptive")),
        "load": round(v.get("load", 0.0), 4),
    }


class Frontend:
    def __init__(
        self,
        plan: Plan,
        wiring: Wiring,
        model: ModelInfo,
        metrics: Metrics | None = None,
        stream_interval: int = 1,
    ):
        self.plan, self.wiring = plan, wiring
        # tokens an SSE chunk waits for (deploy --stream-interval)
        self.stream_interval = stream_interval
        self.model_id = plan.name
        self.tokenizer = model.tokenizer
        self.chat_prompt_ids = model.chat_prompt_ids  # a chat's prompt, templated and tokenized
        self.tool_format = model.tool_format
        self.vocab_size = model.vocab_size
        self.max_context = min(model.max_context, plan.model.max_context)
        self.metrics = metrics or Metrics()
        self.policy = make_policy(plan)
        self.sched = SchedulerState.for_plan(plan)
        self.links = LinkWatch(plan, self.sched, self.metrics)
        credentials = wiring.credentials()
        self.fleet = Fleet(plan, wiring, credentials)
        self.flights = Flights()
        self.fallbacks = Fallbacks(
            plan, self.policy, self.sched, self.metrics, self.links, self.fleet, self.flights
        )
        self.pools = Pools(
            plan,
            self.fleet,
            self.flights,
            self.fallbacks,
            self.sched,
            self.links,
            self.metrics,
            self._on_loop,
        )
        self.accounting = Accounting(
            plan, self.sched, self.metrics, self.links, self.fleet, self.flights
        )
        self.metrics.watch_workers(self.fleet.status)
        self.metrics.watch_deployment(self.model_id, self.accounting.vllm_gauges)
        self.metrics.watch_pools(self.pools.state)
        self.statuses = StatusReports(
            plan, self.policy, self.sched, self.metrics, self.fleet, self.fallbacks
        )
        self.planner: PlannerView | None = None  # deploy --planner's thread (pools.py)
        self.batches = LoopBatches()  # reports from gRPC threads, applied on the loop
        self._dispatch = self.batches.dispatch
        self.leases = Leases(
            self.fleet,
            wiring.lease_s,
            self._dispatch,
            self.fallbacks.lease_lapsed,
            self.fallbacks.lease_renewed,
        )
        self.apis = ApiServers(wiring, credentials)  # deploy --api-servers N
        self.fallbacks.remote_tokens = self.apis.tokens
        self.server, _ = serve(
            FRONTEND,
            credentials,
            unary={
                "Open": (pb.OpenRequest, pb.OpenReply, self._open),
                "Close": (pb.CloseRequest, pb.Empty, self._closed),
            },
            streams_in={"Reports": (pb.Report, pb.Empty, self._reports)},
            port=int(wiring.frontend.rsplit(":", 1)[1]),
            host=wiring.bind_host(wiring.frontend),
            threads=len(wiring.workers) + 8,
        )
        self.leases.start()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.batches.attach(loop)

    def health(self) -> tuple[bool, dict[str, Any]]:
        workers = {i: self.fleet.health(i) for i in self.wiring.workers}
        # an instance live scaling parked, or is starting, is not part of the serving deployment
        scaling = self.fleet.parked | self.fleet.starting
        ready = all(w["ready"] for i, w in workers.items() if i not in scaling)
        down = [i for i, w in workers.items() if w["state"] in ("lost", "unreachable")]
        return ready, {
            "status": "ready" if ready else ("degraded" if down else "starting"),
            "workers": workers,
            "live_requests": len(self.flights),
            "max_tokens_in_flight": self.max_serving_tokens(),
            "mirror_drift": self.statuses.drift,
            "links": self.links.report(),
            "kv_bytes_per_token": self.policy.kv_bytes_per_token,  # what transfers are sized by
            "pools": self.pools.state(),
            "planner": self.planner.report() if self.planner is not None else None,
            "prefill_ms_per_1k_tokens": {
                i: round(self.sched.prefill_s_per_token.get(i, 0.0) * 1e6, 3)
                for i in self.accounting.prefill_rates
            },
        }

    def ready_count(self) -> tuple[int, int]:
        """(instances reporting ready, instances running or starting)."""
        workers = self.health()[1]["workers"]
        running = [w for i, w in workers.items() if i not in self.fleet.parked]
        return sum(1 for w in running if w["ready"]), len(running)

    def max_serving_tokens(self) -> int | None:
        return self.fallbacks.max_serving_tokens()

    def metrics_text(self) -> tuple[bytes, str]:
        self.links.refresh()
        return self.metrics.render()

    def stopped(self, request_id: str) -> None:
        flight = self.flights.live.get(request_id)
        if flight is not None:
            flight.stream.stopped = True

    def timeline(self, request_id: str) -> dict[str, Any] | None:
        return self.flights.timeline(request_id)

    def cached_tokens(self, request_id: str) -> int:
        return cached_tokens(self.flights.timeline(request_id))

    def _on_loop(self, fn: Callable[[], Any], timeout_s: float = 10.0) -> Any:
        """fn() on the frontend's loop (where flight state lives), waited for: live scaling's
        and the planner's calls from their threads (pools.py); LoopStopped once it has stopped."""
        loop = self.batches.running()
        return fn() if loop is None else call_on_loop(loop, fn, timeout_s)

    # ---- the deployer's word on its workers (any thread) ----------------------------------------
    def worker_exited(self, inst: str, summary: str) -> None:
        self._dispatch(lambda: self.fallbacks.worker_exited(inst, summary))

    def worker_restarted(self, inst: str, restarts: int) -> None:
        self._dispatch(lambda: self.fallbacks.worker_restarted(inst, restarts))

    # ---- a request -------------------------------------------------------------------------------
    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        deadline: float,
        variant: str | None,
        handoff: str | None,
    ) -> AsyncIterator[list[int]]:
        flight = self._start(request_id, prompt_ids, sampling, deadline, variant, handoff)
        try:
            await self._submit(flight)
            async for chunk in stream_chunks(flight.stream, deadline):
                yield chunk
        finally:
            self._close(flight)

    def _start(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        deadline: float,
        variant: str | None,
        handoff: str | None,
        api: str = "",
        hashes: list[int] | None = None,
    ) -> Flight:
        """The request routed and in the air (its legs not yet ordered); `api`: the API process
        that streams it (deploy --api-servers), "" this one; `hashes`: the prompt's block hashes
        if that process computed them."""
        if sampling.seed is None:  # every leg must draw the same randomness at each position
            sampling = replace(sampling, seed=random.getrandbits(63))
        with self.metrics.route_s.time():
            route = self._route(request_id, prompt_ids, sampling, variant, handoff, hashes)
        d = route.decision
        st = TokenStream(
            request_id, len(prompt_ids), sampling.max_tokens, d.variant, mode_name(route.handoff)
        )
        st.interval = self.stream_interval
        flight = Flight(st, route, prompt_ids, sampling, deadline, api)
        if api:
            st.on_fail = lambda error: self.apis.fail(api, request_id, error)
        self.flights.add(flight)
        st.event(
            "arrival",
            variant=d.variant,
            reason=d.reason,
            predicted_hit=round(d.predicted_hit, 4),
            predicted_hit_tokens=d.predicted_hit_tokens,
            **({"api": api} if api else {}),
        )
        return flight

    # ---- a request another API process streams (deploy --api-servers N) --------------------------
    def _open(self, req: pb.OpenRequest) -> pb.OpenReply:
        """(a gRPC thread) Route and start it on the loop, as `generate` does its own."""
        loop = self.batches.running()
        if loop is None:
            return pb.OpenReply(status=503, error="the router is starting", retry_after_s=1)
        opened = asyncio.run_coroutine_threadsafe(self.open(req), loop)
        return opened.result(timeout=2 * CALL_TIMEOUT_S)  # _submit's calls have their own

    async def open(self, req: pb.OpenRequest) -> pb.OpenReply:
        deadline = time.monotonic() + req.timeout_s
        sampling = sampling_from_pb(req.sampling)
        ids, variant, handoff = list(req.prompt_ids), req.variant or None, req.handoff or None
        try:
            hashes = list(req.block_hashes)
            if len(hashes) != len(ids) // self.plan.model.block_size:
                hashes = None  # not sent (or not of this prompt): hash it here
            flight = self._start(
                req.request_id, ids, sampling, deadline, variant, handoff, req.api, hashes
            )
        except RequestRejected as exc:
            return rejection(exc)
        try:
            await self._submit(flight)
        except RequestRejected as exc:
            self._close(flight)
            return rejection(exc)
        hit = flight.route.decision.predicted_hit_tokens
        return pb.OpenReply(
            max_serving_tokens=self.max_serving_tokens() or 0, predicted_hit_tokens=hit
        )

    def _closed(self, req: pb.CloseRequest) -> pb.Empty:
        self._dispatch(lambda: self.close_remote(req))
        return pb.Empty()

    def close_remote(self, req: pb.CloseRequest) -> None:
        flight = self.flights.live.get(req.request_id)
        if flight is None or not flight.api:
            return
        ended_remotely(flight, req)
        relays = {name: op.type.relays for name, op in self.plan.operators.items()}
        count_remote(self.metrics, flight, relays)
        self._close(flight)

    def _route(
        self,
        rid: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        variant: str | None,
        handoff: str | None,
        hashes: list[int] | None = None,
    ) -> Route:
        bs = self.plan.model.block_size
        if hashes is None:
            hashes = chain_block_hashes(prompt_ids, bs)
        feats = RequestFeatures(rid, len(prompt_ids), tuple(hashes), sampling.max_tokens, bs)
        self.links.refresh()  # the links as measured now
        self.accounting.entry_queues()
        if variant is not None:
            if variant not in self.plan.variants:
                raise RequestRejected(
                    400,
                    f"unknown variant {variant!r}; this deployment has "
                    f"{', '.join(self.plan.variants)}",
                )
            path = self.policy.topo.paths[variant]
            reason = "variant forced by the request"
            decision = self.policy.build(path, feats, self.sched, reason=reason)
        else:
            decision = self.policy.decide(feats, self.sched)
        route = Route.of(
            self.plan,
            self.fallbacks.around_lost(decision, feats),
            handoff,
            self.policy.params.get("catch_up_load", 0.0),
        )
        self.fallbacks.admit(route, len(prompt_ids), sampling.max_tokens)
        if self.planner is not None:
            self.planner.arrived(route.prefill, feats)
        return route

    async def _submit(self, flight: Flight) -> None:
        r = flight.route
        targets = [
            i
            for i in (r.prefill, r.relay, r.main)
            if i and not (i == r.main and r.decision.singular)
        ]
        order = flight.order(self.plan, lease_epoch=self.fleet.lease_epoch)
        futs = [(i, self.fleet.clients[i].send("Submit", order)) for i in targets]
        r.legs.update(targets)
        for inst, fut in futs:
            try:
                await fut
            except Exception as exc:  # noqa: BLE001 - dead, or cut off: carry on without it
                why = f"worker {inst} did not take the request: {grpc_text(exc)}"
                flight.stream.event("submit_failed", instance=inst, error=why)
                self.fallbacks.carry_on_without(flight, inst)
                if flight.stream.error:
                    raise RequestRejected(503, why) from None

    # ---- reports ---------------------------------------------------------------------------------
    def _reports(self, stream: Iterator[pb.Report], context: Any) -> pb.Empty:
        instance = None
        # a stream that reopened carries, before the worker's full cache listing, what was
        # queued while it was broken: deltas after one lost with it, and statuses that cannot
        # agree with the mirror until the listing replaces it (not drift)
        listed = False
        try:
            for rep in stream:
                instance = rep.instance
                listed = listed or (rep.WhichOneof("body") == "cache" and rep.cache.full)
                self._dispatch(lambda r=rep, exact=listed: self._on_report(r, exact))
        except Exception:  # noqa: BLE001 - the worker's connection broke
            pass
        if instance is not None and not self.fleet.answers(instance):
            self._dispatch(lambda: self.fallbacks.worker_lost(instance))
        return pb.Empty()

    def _on_report(self, rep: pb.Report, listed: bool = True) -> None:
        which = rep.WhichOneof("body")
        self.metrics.report_counter(which).inc()
        if which == "status":
            self.statuses.on_status(rep.instance, rep.status, listed)
        elif which == "cache":
            self.statuses.on_cache(rep.instance, rep.cache)
        elif which == "tokens":  # one engine step's tokens, every sequence it advanced
            op = self.plan.operator_of(rep.instance)
            new = sum(self._on_tokens(rep.instance, op, t) for t in rep.tokens.tokens)
            if new:
                self.metrics.count_tokens(op.name, new, op.type.relays)
        elif which == "event":
            self._on_event(rep.instance, rep.event)
        elif which == "failure":
            self.accounting.transfer_failed(rep.instance, rep.failure)
            self.fallbacks.leg_failed(rep.instance, rep.failure)

    def _on_tokens(self, inst: str, op: OperatorPlan, t: pb.Tokens) -> int:
        """One sequence's new tokens into its flight's stream; how many the stream took."""
        flight = self.flights.get(t.seq_id)
        if flight is None:
            return 0
        st, r = flight.stream, flight.route
        before = len(st.tokens)
        lps = logprobs_from_pb(t)
        run = TokenRun(int(t.start), list(t.ids), op.name, t.final, lps, t.finish_reason)
        if op.type.prefill_only:  # the first token ended the request (else it went with the KV)
            r.legs.discard(inst)
            st.add(run)
        else:
            try:
                st.add(run)
            except StreamConflict as exc:
                st.fail(str(exc))
                return 0
            if t.final:
                r.legs.discard(inst)
        new = len(st.tokens) - before
        if new:
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
        return new

    def _on_event(self, inst: str, e: pb.Event) -> None:
        flight = self.flights.get(e.seq_id)
        if e.kind in (pb.EVENT_KV_SEND, pb.EVENT_KV_SENT):
            self.accounting.transfer(inst, e)
            if e.kind == pb.EVENT_KV_SEND and flight is not None:
                self.accounting.prefill(inst, flight, e)
                flight.route.legs.discard(inst)  # prefill's leg ends as its KV leaves
        elif e.kind == pb.EVENT_EXTEND_DONE and e.values.get("final"):
            # main has the turn: its leg is over (the request may have ended: main lingered)
            lingering = self.flights.lingering
            route = flight.route if flight is not None else lingering.get(e.seq_id)
            lingering.pop(e.seq_id, None)
            if route is not None and route.handoff_asked and inst == route.main:
                seconds = time.monotonic() - route.handoff_asked
                self.metrics.handoff.labels(mode_name(route.handoff) or "none").observe(seconds)
                route.handoff_asked = 0.0
        # an ended request's timeline still takes its legs' late events
        st = self.flights.stream(e.seq_id)
        if st is not None:
            where = {"channel": e.channel, "peer": e.peer} if e.peer else {}
            if e.kind == pb.EVENT_HANDOFF_STARTED:
                st.event("handoff_start", instance=inst, **handoff_start(e))
            else:
                st.event(event_name(e.kind), instance=inst, **where, **dict(e.values))
        if flight is None:
            return
        r = flight.route
        if e.kind in (pb.EVENT_KV_LANDED, pb.EVENT_KV_RECOMPUTED):
            r.landed.add(inst)
        if e.kind == pb.EVENT_HANDOFF_STARTED and inst == r.relay:
            # main told the relay its KV landed; the relay chose the mode from its own load
            r.handoff, r.handoff_asked = int(e.values["mode"]), time.monotonic()
        elif e.kind == pb.EVENT_HANDOFF_SENT and inst == r.relay:
            r.handed_off = True
            if e.values.get("switched"):  # busy between catch-up batches: the rest at once
                r.handoff = pb.HANDOFF_ONE_SHOT
                self.metrics.handoff_switches.inc()

    # ---- a request's end ------------------------------------------------------------------------
    def _close(self, flight: Flight) -> None:
        st, r = flight.stream, flight.route
        ok = st.finished and not st.error
        reason = "finished" if ok else (st.error or "client went away")
        if st.stopped and not ok:
            reason = "its output hit a stop string"
        for inst in list(r.legs):
            # main still extends over the relay's IDs to keep its cache; it ends the leg itself
            if ok and inst == r.main and r.relay and not r.decision.singular:
                self.flights.linger(flight)
                continue
            self.fleet.abort_leg(flight, inst, reason)
        finish = finish_reason(flight)
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
        self.flights.end(flight)

    def close(self) -> None:
        self.leases.stop()
        self.server.stop(grace=0.5)
        self.fleet.close()
