"""Live scaling's side of the frontend (docs/runtime.md, Live scaling): each pool's instances by
state, and the moves `Deployment.scale` makes from its own thread: expect an instance it starts,
drain one it will stop, count what one still holds, park one it stopped. Every move runs on the
frontend's loop, where flight state lives (`on_loop`), and is waited for."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from pddflow.graph.plan import Plan
from pddflow.runtime.frontend.fallbacks import Fallbacks
from pddflow.runtime.frontend.fleet import Fleet
from pddflow.runtime.frontend.flight import Flights
from pddflow.runtime.frontend.link_watch import LinkWatch
from pddflow.runtime.frontend.metrics import Metrics
from pddflow.scheduler import RequestFeatures, SchedulerState
from pddflow.scheduler.features import UNAVAILABLE

log = logging.getLogger("pddflow.frontend")


class PlannerView(Protocol):
    """The planner's thread as the frontend sees it (runtime/deploy/autoscaler.py): it hears
    each routed request, and /health shows its report."""

    def arrived(self, prefill: str, req: RequestFeatures) -> None: ...

    def report(self) -> dict: ...


class Pools:
    def __init__(
        self,
        plan: Plan,
        fleet: Fleet,
        flights: Flights,
        fallbacks: Fallbacks,
        sched: SchedulerState,
        links: LinkWatch,
        metrics: Metrics,
        on_loop: Callable[[Callable[[], Any]], Any],
    ):
        self.plan, self.fleet, self.flights, self.fallbacks = plan, fleet, flights, fallbacks
        self.sched, self.links, self.metrics, self.on_loop = sched, links, metrics, on_loop
        for inst in fleet.parked:  # wired for live scaling, not running: no work
            sched.set_load(inst, UNAVAILABLE)

    def state(self) -> dict[str, dict[str, Any]]:
        """Each operator's instances by state, and how many serve."""
        out = {}
        for name, op in self.plan.operators.items():
            states = {i: self.fleet.health(i)["state"] for i in op.instances}
            out[name] = {
                "serving": sum(1 for st in states.values() if st == "up"),
                "max": len(op.instances),
                "instances": states,
            }
        return out

    def expect(self, inst: str) -> None:
        """`inst` is being started: no work until it reports ready (the frontend's status
        handler lets it join)."""

        def move() -> None:
            self.fleet.starting.add(inst)
            self.fleet.parked.discard(inst)
            self.sched.set_load(inst, UNAVAILABLE)

        self.on_loop(move)

    def drain(self, inst: str) -> None:
        """No new work for `inst`; what it holds runs on (see busy)."""

        def move() -> None:
            self.fleet.draining.add(inst)
            self.sched.set_load(inst, UNAVAILABLE)

        self.on_loop(move)

    def busy(self, inst: str) -> int:
        """Legs `inst` still holds: of live requests (main's lingering extends included), and by
        its last status."""

        def count() -> int:
            held = sum(1 for f in self.flights if inst in f.route.legs)
            held += sum(1 for r in self.flights.lingering.values() if inst in (r.relay, r.main))
            # a lost instance's last status is stale: its legs went on elsewhere
            status = self.fleet.status.get(inst) if inst not in self.fleet.lost else None
            return held + (len(status.legs) if status is not None else 0)

        return self.on_loop(count)

    def park(self, inst: str) -> None:
        """`inst` is stopped (scaled away, or it failed to start): a leg it still holds goes on
        elsewhere as for a lost worker; its cache mirror and status are forgotten."""

        def move() -> None:
            for flight in list(self.flights):
                if inst in flight.route.legs and not flight.stream.finished:
                    self.fallbacks.carry_on_without(flight, inst)
            for seq_id, route in list(self.flights.lingering.items()):
                if inst in (route.relay, route.main):
                    self.flights.lingering.pop(seq_id)
            self.fleet.draining.discard(inst)
            self.fleet.starting.discard(inst)
            # lost while starting or draining: it starts again, when it does, as a new instance
            self.fleet.lost.discard(inst)
            self.fleet.restarting.discard(inst)
            self.fleet.parked.add(inst)
            self.fleet.status.pop(inst, None)
            self.sched.set_load(inst, UNAVAILABLE)
            m = self.sched.mirror(inst)
            if m is not None:
                m.reset([])
            self.links.forget(inst)
            self.metrics.worker_up.labels(inst).set(0)
            log.warning("%s parked", inst)

        self.on_loop(move)
