"""The relay's token-ID handoff to main, split into batches by `core/handoff_batches.py` exactly
as the relay worker splits it: checked at each relay step boundary and whenever main has
extended every batch it was sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pddflow.core.handoff_batches import HandoffBatches, HandoffStep
from pddflow.scheduler import Policy, SchedulerState
from pddflow.sim.engine import Job, StepKind
from pddflow.sim.fleet import SimFleet
from pddflow.sim.flight import SimFlight
from pddflow.sim.network import IDS_BYTES_PER_TOKEN, RDMA_LATENCY_S


class HandoffLegs(Protocol):
    """What a handoff does to the flight's decode legs (sim/decode_legs.py's `DecodeLegs`)."""

    def relay_release(self, flight: SimFlight) -> None: ...

    def release_main(self, flight: SimFlight) -> None: ...

    def decode_on_main(self, flight: SimFlight, tokens0: int, t_emitted: float | None) -> None:
        """Main decodes on from `tokens0` output tokens (emitted at `t_emitted`)."""


class Handoffs:
    """Every flight's handoff, on `fleet`; an adaptive handoff's mode is the policy's, read from
    the scheduler's `state` as the router would."""

    def __init__(
        self, fleet: SimFleet, policy: Policy, state: SchedulerState, legs: HandoffLegs
    ) -> None:
        self.fleet, self.policy, self.state, self.legs = fleet, policy, state, legs
        self.loop, self.engines, self.links = fleet.loop, fleet.engines, fleet.links

    def start(self, flight: SimFlight, now: float) -> None:
        """Main holds the prompt's KV: the handoff starts (an adaptive one's mode is
        decided now, from the relay's load now)."""
        if flight.done:
            self.legs.release_main(flight)
            return
        relay = self.engines[flight.relay.instance]
        if not relay.is_running(flight.relay.seq):  # still queued for a batch slot: take it over
            relay.remove(flight.relay.seq)
            flight.handoff = "takeover"
            self.legs.relay_release(flight)
            self.legs.decode_on_main(flight, 0, None)
            return
        mode = flight.decision.handoff or "one_shot"
        if flight.path.variant.handoff == "adaptive":
            self.state.set_load(
                flight.relay.instance, self.fleet.instance_load(flight.relay.instance)
            )
            mode = self.policy.handoff_mode(flight.path, flight.relay.instance, self.state) or mode
        flight.handing_off, flight.main_waiting = mode, True
        self._advance(flight, now)

    def _batches(self, flight: SimFlight) -> HandoffBatches:
        v = flight.path.variant
        adaptive = v.handoff == "adaptive"
        return HandoffBatches(
            v.catch_up_tokens,
            v.min_extend_tokens,
            self.policy.params.get("catch_up_load", 0.0) if adaptive else 0.0,
        )

    def _poll(self, flight: SimFlight) -> None:
        """Check again after the relay's next step (one check queued at a time)."""
        if not flight.polling:
            flight.polling = True
            relay = self.engines[flight.relay.instance]
            relay.submit_after_step(lambda now: self._advance(flight, now))

    def _advance(self, flight: SimFlight, now: float) -> None:
        flight.polling = False
        if flight.done:
            self.legs.release_main(flight)
            return
        if (
            flight.handing_off is None or flight.relay_tokens
        ):  # not started, or the final batch went
            return
        relay = self.engines[flight.relay.instance]
        seq = flight.relay.seq
        n = relay.generated(seq)
        unsent = n - flight.ids_sent
        batches, load = self._batches(flight), self.fleet.instance_load(flight.relay.instance).load
        step = batches.step(
            flight.handing_off,
            unsent,
            finished=False,
            main_waiting=flight.main_waiting,
            relay_load=load,
        )
        if step is HandoffStep.WAIT:
            self._poll(flight)
            return
        ctx = flight.req.prompt_tokens + flight.ids_sent
        flight.ids_sent = n
        flight.rounds += 1
        main = self.engines[flight.main.instance]
        if step is HandoffStep.FINAL:
            flight.switched = batches.switched(
                flight.handing_off, unsent, main_waiting=flight.main_waiting, relay_load=load
            )
            relay.remove(seq)
            flight.relay_tokens = n
            flight.handoff = "one_shot" if flight.switched else flight.handing_off
            self.legs.relay_release(flight)
            job = Job(flight, unsent, ctx, self._extended_final, StepKind.EXTEND)
            self._ids(flight, unsent, lambda t: main.submit_job(job))
            return
        flight.main_waiting = False
        flight.extends_pending += 1
        job = Job(flight, unsent, ctx, self._extended_round, StepKind.EXTEND)
        self._ids(flight, unsent, lambda t: main.submit_job(job))
        self._poll(flight)

    def _ids(self, flight: SimFlight, ntokens: int, then: Callable[[float], None]) -> None:
        ch = flight.path.handoff
        nbytes = max(ntokens, 1) * IDS_BYTES_PER_TOKEN
        if ch is not None and ch.link is not None:
            self.links[ch.link].message(nbytes, then)
        else:
            self.loop.after(RDMA_LATENCY_S, lambda: then(self.loop.now))

    def _extended_round(self, job: Job, t: float) -> None:
        flight = job.flight
        if flight.done:
            self.legs.release_main(flight)
            return
        flight.extends_pending -= 1
        if flight.extends_pending or flight.relay_tokens:
            return

        # caught up: main says so; the relay reads it at its next step boundary
        def caught_up(_t: float) -> None:
            flight.main_waiting = True
            self._poll(flight)

        self._ids(flight, 1, caught_up)

    def _extended_final(self, job: Job, t: float) -> None:
        """The extend over the last handed-off IDs also yields the next token."""
        flight = job.flight
        self.legs.decode_on_main(flight, flight.relay_tokens + 1, t)
