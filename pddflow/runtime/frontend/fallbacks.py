"""The frontend's declared fallbacks: what happens to flights when a leg fails or a worker is lost,
how new requests are routed around lost workers until they are back, and admission by KV memory.
Everything runs on the frontend's event loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from pddflow.core.kv_budget import kv_fit
from pddflow.core.leg_lifetimes import ORPHAN_GRACE_S
from pddflow.graph.plan import Plan
from pddflow.runtime.frontend.fleet import Fleet
from pddflow.runtime.frontend.flight import Flight, Flights
from pddflow.runtime.frontend.link_watch import LinkWatch
from pddflow.runtime.frontend.metrics import Metrics
from pddflow.runtime.frontend.rejection import RequestRejected
from pddflow.runtime.frontend.route import Route
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.wire import sampling_to_pb
from pddflow.scheduler import Policy, RequestFeatures, SchedulerState
from pddflow.scheduler.decision import Decision
from pddflow.scheduler.features import UNAVAILABLE

log = logging.getLogger("pddflow.frontend")
RETRY_AFTER_S = 5  # what a 503 tells the client while a lost worker restarts


class Fallbacks:
    def __init__(
        self,
        plan: Plan,
        policy: Policy,
        sched: SchedulerState,
        metrics: Metrics,
        links: LinkWatch,
        fleet: Fleet,
        flights: Flights,
    ):
        self.plan, self.policy, self.sched, self.metrics = plan, policy, sched, metrics
        self.links, self.fleet, self.flights = links, fleet, flights
        self.orphans: dict[str, dict[str, float]] = {}  # instance -> {seq_id: first seen ended}
        # what an API process holds of a request (deploy --api-servers: ApiServers.tokens)
        self.remote_tokens: Callable[[str, str], Awaitable[list[int] | None]] | None = None
        self._resuming: set[asyncio.Task] = set()

    # ---- failures of one leg -------------------------------------------------------------------
    def leg_failed(self, inst: str, f: pb.Failure) -> None:
        flight = self.flights.get(f.seq_id)
        if flight is None:
            self._lingering_failed(inst, f)
            return
        st, r = flight.stream, flight.route
        kind = pb.FailureKind.Name(f.kind).removeprefix("FAILURE_").lower()
        where = {"channel": f.channel, "peer": f.peer} if f.peer else {}
        st.event("leg_failed", instance=inst, kind=kind, **where, error=f.error)
        if f.kind == pb.FAILURE_LEASE_LAPSED:  # it could not hear us: carry on without it
            self.metrics.fallbacks.labels("lease_lapsed").inc()
            self.carry_on_without(flight, inst)
            return
        if f.kind == pb.FAILURE_KV_RECOVERED:
            self.metrics.fallbacks.labels("kv_recomputed").inc()
            return
        if f.kind == pb.FAILURE_KV_TRANSFER:
            reason = f"{inst} -> {f.peer}: {f.error}"
            self.fleet.call(f.peer, "Recompute", pb.Cancel(seq_id=f.seq_id, reason=reason))
            return
        if f.kind == pb.FAILURE_HANDOFF:  # main unreachable: the relay keeps decoding to the end
            self.metrics.fallbacks.labels("singular").inc()
            if r.main in r.legs:
                self.fleet.abort_leg(flight, r.main, "handoff failed")
            return
        if inst == r.main and r.relay and not r.handed_off and r.relay in r.legs:
            self.metrics.fallbacks.labels("singular").inc()
            r.main, r.handoff = "", pb.HANDOFF_NONE
            return
        st.fail(f"{inst}: {kind}: {f.error}")  # a leg's own error: running it elsewhere repeats it

    def _lingering_failed(self, inst: str, f: pb.Failure) -> None:
        """The request has ended but main still waits to extend over it: the relay's IDs or
        prefill's KV will not come, so main's leg ends now (its cache misses this turn)."""
        route = self.flights.lingering.get(f.seq_id)
        if route is None or f.kind not in (pb.FAILURE_HANDOFF, pb.FAILURE_KV_TRANSFER):
            return
        del self.flights.lingering[f.seq_id]
        cancel = pb.Cancel(seq_id=f.seq_id, reason=f"{inst}: {f.error}")
        self.fleet.call(route.main, "Abort", cancel)

    # ---- orphaned legs -------------------------------------------------------------------------
    def reap_orphans(self, inst: str, legs: Iterable[str]) -> None:
        """Abort `inst`'s legs whose request has ended once they outlive a grace period (an abort
        on its way, a leg that lands after its request closed): an abort that was lost must not
        hold KV blocks until the leg's deadline."""
        now = time.monotonic()
        seen = self.orphans.setdefault(inst, {})
        orphans = {
            s for s in legs if self.flights.get(s) is None and not self.flights.lingers(s, now)
        }
        for seq_id in [s for s in seen if s not in orphans]:
            del seen[seq_id]
        for seq_id in orphans:
            if now - seen.setdefault(seq_id, now) > ORPHAN_GRACE_S:
                del seen[seq_id]  # if this abort is lost too, the next sweep sends another
                self.metrics.orphans_aborted.labels(inst).inc()
                log.warning("%s holds %s, whose request has ended: aborting it", inst, seq_id)
                cancel = pb.Cancel(seq_id=seq_id, reason="its request ended")
                self.fleet.call(inst, "Abort", cancel)

    # ---- workers lost and back -----------------------------------------------------------------
    def worker_lost(self, inst: str) -> None:
        if inst in self.fleet.lost or inst in self.fleet.parked:  # parked: stopped on purpose
            return
        log.error("worker %s is gone", inst)
        self._lose(inst, f"{inst} lost")

    def lease_lapsed(self, inst: str) -> None:
        """The frontend has not heard `inst`, or `inst` has not answered its grants, for the
        lease: the same as lost for its requests and for routing, though it may still run."""
        if inst in self.fleet.lost or inst in self.fleet.parked:
            return
        link = self.plan.link_between(self.plan.frontend_cluster, self.plan.instance(inst).cluster)
        if link and not any(self._across(i, link) for i in self.fleet.unreachable):
            self.metrics.partitions.labels(link).inc()
        self.fleet.unreachable.add(inst)
        self.metrics.lease_lapses.labels(inst).inc()
        log.error("lease on %s lapsed: carrying its requests on without it", inst)
        self._lose(inst, f"{inst} unreachable (lease lapsed)", event="lease_lapsed")

    def lease_renewed(self, inst: str) -> None:
        """Heard again, and answering: new work may go to it."""
        self.fleet.unreachable.discard(inst)
        self.fleet.lost.discard(inst)
        self.metrics.worker_up.labels(inst).set(1)
        log.warning("lease on %s renewed: it is back", inst)

    def _across(self, inst: str, link: str) -> bool:
        front = self.plan.frontend_cluster
        return self.plan.link_between(front, self.plan.instance(inst).cluster) == link

    def _lose(self, inst: str, why: str, event: str = "") -> None:
        self.fleet.lost.add(inst)
        self.sched.set_load(inst, UNAVAILABLE)
        self.links.forget(inst)
        self.metrics.worker_up.labels(inst).set(0)
        for flight in self.flights:
            if not flight.stream.finished:
                held = inst in flight.route.legs or inst == flight.route.prefill
                if event and held:
                    flight.stream.event(event, instance=inst)
                self.carry_on_without(flight, inst)
        for seq_id, route in list(self.flights.lingering.items()):
            if inst in (route.relay, route.main):  # main waits for IDs a lost relay never sends
                self.flights.lingering.pop(seq_id)
                self.fleet.call(route.main, "Abort", pb.Cancel(seq_id=seq_id, reason=why))

    def worker_exited(self, inst: str, summary: str) -> None:
        """The deployer saw a process of the instance end: it is lost until the deployer has
        restarted it (a surviving rank's leader still reports ready meanwhile)."""
        self.fleet.exits[inst] = summary.splitlines()[0]
        self.fleet.restarting.add(inst)
        self.worker_lost(inst)

    def worker_restarted(self, inst: str, restarts: int) -> None:
        self.fleet.restarts[inst] = restarts
        self.fleet.restarting.discard(inst)
        self.metrics.worker_restarts.labels(inst).inc()

    def worker_back(self, inst: str) -> None:
        """A lost worker reports ready again (restarted): its mirror was reset from its own
        report, and the scheduler may route to it."""
        if inst in self.fleet.restarting or inst in self.fleet.unreachable:
            # a survivor of the instance that the deployer is about to restart; or one whose
            # lease lapsed, which is back when the lease is (leases.py)
            return
        self.fleet.lost.discard(inst)
        self.metrics.worker_up.labels(inst).set(1)
        log.warning("worker %s is back", inst)

    def carry_on_without(self, flight: Flight, inst: str) -> None:
        """Carry `flight` on without `inst` (lost, or stopped by live scaling); nothing when a
        decoder holds no leg of it (any more: one lost twice, restarted between). A prefill's
        leg ends as its KV leaves, but that KV may not have landed yet."""
        r = flight.route
        if inst not in r.legs and inst != r.prefill:
            return
        r.legs.discard(inst)
        if inst == r.prefill and inst not in r.resumed_on:
            decoders = [d for d in (r.relay, r.main) if d and d in r.legs]
            if not decoders:  # nobody else on the route (colocated): a decoder prefills it
                if not self._resume(flight, lost=inst):
                    flight.stream.fail(f"prefill {inst} was lost and no decoder can take over")
                return
            # the KV still on its way will not come: the decoders recompute it, and the one that
            # starts alone samples the first token that was to come with it, as prefill would
            for d in decoders:
                if d not in r.landed:
                    reason = f"prefill {inst} was lost before the KV landed"
                    cancel = pb.Cancel(seq_id=flight.request_id, reason=reason)
                    self.fleet.call(d, "Recompute", cancel)
            return
        if inst == r.relay and r.handed_off:
            return  # main has taken over
        if inst in (r.relay, r.main) or inst in r.resumed_on:
            if not self._resume(flight, lost=inst):
                flight.stream.fail(f"worker {inst} was lost and no other instance can finish it")

    def _resume(self, flight: Flight, lost: str) -> bool:
        """Resume on a surviving decoder (the route's other one, else any decoder of the plan),
        which prefills prompt + tokens so far locally and continues at the same position."""
        r = flight.route
        if r.resumed_seq:
            return False
        prefer = (r.relay, r.main)
        target = next((i for i in self.fleet.decoders(prefer) if i != lost), None)
        if target is None:
            return False
        for inst in list(r.legs):
            self.fleet.abort_leg(flight, inst, f"resuming on {target}")
        seq_id = self.flights.resume(flight)
        r.legs.add(target)
        r.resumed_on.add(target)
        if not flight.api:
            self._resume_from(flight, target, seq_id, list(flight.stream.tokens))
            return True

        async def from_api() -> None:  # the tokens so far are the API process's
            assert self.remote_tokens is not None
            done = await self.remote_tokens(flight.api, flight.request_id)
            if flight.stream.finished:
                return
            if done is None:
                flight.stream.fail(f"resuming on {target}: {flight.api} holds no tokens of it")
                return
            self._resume_from(flight, target, seq_id, done)

        task = asyncio.get_running_loop().create_task(from_api())
        self._resuming.add(task)
        task.add_done_callback(self._resuming.discard)
        return True

    def _resume_from(self, flight: Flight, target: str, seq_id: str, done: list[int]) -> None:
        s = flight.sampling
        order = flight.order(
            self.plan,
            seq_id=seq_id,
            prompt_ids=flight.prompt_ids + done,
            local_prefill=True,
            output_offset=len(done),
            relay="",
            main="",
            handoff=pb.HANDOFF_NONE,
            main_cached_blocks=0,
            singular=False,
            sampling=sampling_to_pb(s, s.max_tokens - len(done)),
            lease_epoch=self.fleet.lease_epoch,
        )
        flight.stream.event("resumed", instance=target, from_token=len(done))
        self.metrics.fallbacks.labels("resumed_elsewhere").inc()
        self.fleet.call(target, "Submit", order)

    # ---- routing around lost workers -----------------------------------------------------------
    def around_lost(self, decision: Decision, feats: RequestFeatures) -> Decision:
        """`decision` if its instances are up; else the same request on a path that avoids the
        lost ones (relay lost: P-MD; main lost: the relay finishes it), else 503."""
        lost = self.fleet.unavailable
        dead = [i for i in decision.instances if i in lost]
        if not dead:
            return decision
        why = f"{', '.join(dead)} down"
        paths = self.policy.topo.paths
        for path in paths.values():
            d = self.policy.build(path, feats, self.sched, reason=f"{why}: {path.name}")
            if not any(i in lost for i in d.instances):
                return d
        for path in paths.values():
            if path.relay is None:
                continue
            d = self.policy.build(
                path, feats, self.sched, singular=True, reason=f"{why}: the relay finishes"
            )
            needed = [inst for op, inst in d.targets if op != path.main]
            if not any(i in lost for i in needed):
                return d
        raise RequestRejected(
            503, f"{why}; no path around them (restarting)", retry_after_s=RETRY_AFTER_S
        )

    def admit(self, route: Route, prompt_tokens: int, max_tokens: int) -> None:
        """400 at once when an instance on the route could never hold the request's KV."""
        bs = self.plan.model.block_size
        for inst, holds_output in _holds(route):
            s = self.fleet.status.get(inst)
            if s is None or not s.kv_blocks_total:
                continue
            fit = kv_fit(
                prompt_tokens, max_tokens, bs, s.kv_blocks_total, holds_output=holds_output
            )
            if not fit.fits:
                raise RequestRejected(400, fit.refusal(inst))

    def max_serving_tokens(self) -> int | None:
        """The longest prompt + output every decoder can hold (None before their first status)."""
        caps = [
            s.kv_blocks_total * self.plan.model.block_size
            for i, s in self.fleet.status.items()
            if self.plan.operator_of(i).type.decodes and s.kv_blocks_total
        ]
        return min(caps) if caps else None


def _holds(route: Route) -> list[tuple[str, bool]]:
    """(instance, whether it holds the output's KV too) for every instance on the route: a
    prefill instance hands the output to its decoders unless it decodes itself (colocated)."""
    out = []
    decoders = [route.relay, "" if route.decision.singular else route.main]
    if route.prefill and route.prefill not in decoders:
        out.append((route.prefill, not route.relay and not route.main))
    out += [(d, True) for d in decoders if d]
    return out
