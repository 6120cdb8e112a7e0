"""A prompt's KV on its way to the decoders: the relay's copy over RDMA and main's over the
WAN (or RDMA), their landing (memory reserved only then, as the runtime does) and release."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pddflow.core.leg_lifetimes import LINGER_MAX_S, ORPHAN_GRACE_S
from pddflow.scheduler import Policy, SchedulerState
from pddflow.sim.engine import Job, Seq, StepKind
from pddflow.sim.fleet import SimFleet
from pddflow.sim.flight import LegState, SimFlight
from pddflow.sim.handoff import Handoffs
from pddflow.sim.kvstore import Hold
from pddflow.sim.network import RDMA_LATENCY_S

_LIVE = (LegState.TRANSFER, LegState.MEMORY, LegState.DECODING)


class FlightEnds(Protocol):
    """What the legs call when a flight's output starts, ends or fails (the simulation, which
    keeps the flights and releases the next turns of a session)."""

    def first_token(self, seq: Seq, t: float) -> None: ...

    def seq_finished(self, seq: Seq, t: float) -> None: ...

    def finish(self, flight: SimFlight, t: float) -> None:
        """The flight's output is complete (its decoders' KV is released separately)."""

    def finish_and_release(self, flight: SimFlight, t: float) -> None:
        """`finish`, and release the KV of the decoder that ended it."""

    def fail(self, flight: SimFlight, why: str) -> None: ...


class DecodeLegs:
    """The relay's and main's legs of every flight, on `fleet`; the relay's token-ID
    handoff to main is `handoffs` (sim/handoff.py), which it starts once main
    holds the KV."""

    def __init__(
        self, fleet: SimFleet, ends: FlightEnds, policy: Policy, state: SchedulerState
    ) -> None:
        self.fleet, self.ends = fleet, ends
        self.loop, self.topo = fleet.loop, fleet.topo
        self.engines, self.stores, self.links = fleet.engines, fleet.stores, fleet.links
        self.block_tokens, self.embedded = fleet.block_tokens, fleet.embedded
        self.handoffs = Handoffs(fleet, policy, state, self)

    def _copy_left(self, flight: SimFlight) -> None:
        """One of the prefill's outgoing copies has left: the last frees the prompt's KV there."""
        leg = flight.prefill
        leg.copies -= 1
        if leg.copies == 0 and leg.hold is not None:
            self.stores[leg.instance].release(leg.hold)
            leg.hold = None

    def _land(
        self,
        flight: SimFlight,
        inst: str,
        hold: Hold,
        waiting: Callable[[], bool],
        then: Callable[[], None],
        drop: Callable[[], None],
        optional: Callable[[], bool] = lambda: False,
    ) -> None:
        """Reserve the rest of the prompt and the whole output now or, FIFO, when memory frees.
        `waiting()` says the leg still wants the memory; if not, `drop()` it. An `optional()` leg
        (its turn ended elsewhere) is dropped rather than made to wait."""
        store = self.stores[inst]
        extra = -(-flight.req.output_tokens // self.block_tokens)
        landed = self.loop.now

        def attempt() -> bool:
            if not waiting():
                drop()
                return True
            try:
                if not store.reserve(hold, extra):
                    if optional():
                        drop()
                        return True
                    return False
            except ValueError as exc:
                self.ends.fail(flight, str(exc))
                return True
            flight.memory_wait_s += self.loop.now - landed
            ready = store.load_deferred(hold)  # host-tier blocks of its hit, into the room
            if ready > self.loop.now:
                # the leg may be cancelled while they load (a singular request's relay finished)
                self.loop.at(ready, lambda: then() if waiting() else drop())
            else:
                then()
            return True

        if store.waiters and optional():
            drop()
            return
        if store.waiters or not attempt():
            flight.memory_waits += 1
            store.wait(attempt)

    def relay_send(self, flight: SimFlight) -> None:
        flight.relay.state = LegState.TRANSFER
        nbytes = self.fleet.kv_bytes(flight.req.prompt_tokens, 0)
        rate = self.topo.rdma_bytes_per_s(flight.path.prefill, flight.path.relay)
        self.loop.after(RDMA_LATENCY_S + nbytes / rate, self._relay_landed, flight)

    def _relay_landed(self, flight: SimFlight) -> None:
        self._copy_left(flight)
        flight.relay.landed_at = self.loop.now
        # as a worker, a busy decoder takes landed KV (and shows its first token) at a boundary
        self.engines[flight.relay.instance].submit_control(lambda _now: self._relay_import(flight))

    def _relay_import(self, flight: SimFlight) -> None:
        leg = flight.relay
        if leg.state is not LegState.TRANSFER or flight.done or leg.hold is None:
            self.relay_release(flight)
            return
        leg.state = LegState.MEMORY
        self._land(
            flight,
            leg.instance,
            leg.hold,
            lambda: leg.state is LegState.MEMORY and not flight.done,
            lambda: self._relay_start(flight),
            lambda: self.relay_release(flight),
        )

    def _relay_start(self, flight: SimFlight) -> None:
        leg = flight.relay
        self.stores[leg.instance].commit(leg.hold, flight.req.hashes)
        leg.state = LegState.DECODING
        leg.started_at = self.loop.now
        first = 1 if self.embedded and flight.req.output_tokens > 1 else 0
        if first and flight.first_token_at is None:
            flight.first_token_at = (
                self.loop.now
            )  # the relay emits prefill's first token on landing
        leg.seq = Seq(
            flight,
            flight.req.rid,
            flight.req.prompt_tokens + first,
            first,
            flight.req.output_tokens,
            None if first else self.ends.first_token,
            self._relay_finished,
        )
        self.engines[leg.instance].submit_seq(leg.seq)

    def relay_release(self, flight: SimFlight) -> None:
        # the leg's state first: a release wakes memory waiters at once, this leg's own landing
        # among them, which must see it released (it reserved and started a released relay)
        leg = flight.relay
        hold, leg.hold = leg.hold, None
        if leg.state in _LIVE:
            decoding = leg.state is LegState.DECODING
            leg.state = LegState.RELEASED if decoding else LegState.CANCELLED
        if hold is not None:
            self.stores[leg.instance].release(hold)

    def _relay_finished(self, seq: Seq, t: float) -> None:
        """Singular traffic, or an output shorter than the transfer."""
        flight = seq.flight
        flight.relay_tokens = flight.req.output_tokens
        self.relay_release(flight)
        self.ends.finish(flight, t)
        fin = flight.main
        if flight.decision.singular and fin.state in (LegState.MEMORY, LegState.TRANSFER):
            self._cancel_main(flight)
        elif fin.state is LegState.MEMORY:  # as the runtime's main: no waiting to cache a turn
            self._skip_turn(flight)
        elif fin.state is LegState.TRANSFER:
            # main may still extend over the ended turn; the runtime's orphan sweep aborts a leg
            # that has not landed by then
            self.loop.after(LINGER_MAX_S + ORPHAN_GRACE_S, self._reap, flight)

    def _skip_turn(self, flight: SimFlight) -> None:
        """The relay finished the turn and main has no room to cache it: it lets it go
        (MainWorker._skip_turn) instead of waiting with its prefix pinned."""
        fin = flight.main
        if fin.state is LegState.MEMORY:
            fin.state = LegState.CANCELLED
        self.release_main(flight)

    def _reap(self, flight: SimFlight) -> None:
        if flight.main.state in (LegState.MEMORY, LegState.TRANSFER):
            self._cancel_main(flight)

    def _cancel_main(self, flight: SimFlight) -> None:
        fin = flight.main
        if fin.flow is not None:
            fin.bytes = self.links[flight.path.wan_link].cancel(fin.flow)
            self._copy_left(flight)
        elif fin.state is LegState.TRANSFER:
            return  # an RDMA leg: it lands on its own
        fin.state = LegState.CANCELLED
        self.release_main(flight)

    def send_to_main(self, flight: SimFlight) -> None:
        fin = flight.main
        fin.state = LegState.TRANSFER
        fin.hit_blocks = fin.hold.hit
        nbytes = self.fleet.kv_bytes(flight.req.prompt_tokens, fin.hit_blocks)
        fin.bytes = nbytes
        fin.sent_at = self.loop.now
        link = flight.path.wan_link
        if link is not None:
            fin.flow = self.links[link].send(nbytes, lambda t: self._main_landed(flight))
        else:
            rate = self.topo.rdma_bytes_per_s(flight.path.prefill, flight.path.main)
            self.loop.after(RDMA_LATENCY_S + nbytes / rate, self._main_landed, flight)

    def _main_landed(self, flight: SimFlight) -> None:
        self._copy_left(flight)
        fin = flight.main
        fin.flow = None
        if fin.state is not LegState.TRANSFER:
            return
        fin.transfer_s = self.loop.now - fin.sent_at
        # taken at a step boundary, as the relay's
        self.engines[fin.instance].submit_control(lambda _now: self._main_import(flight))

    def _main_import(self, flight: SimFlight) -> None:
        fin = flight.main
        if fin.state is not LegState.TRANSFER or fin.hold is None:
            return
        if fin.hold.ready_at > self.loop.now:
            # its cached prefix is still loading from the host tier: import once it is in HBM
            eng = self.engines[fin.instance]
            self.loop.at(
                fin.hold.ready_at, eng.submit_control, lambda _now: self._main_import(flight)
            )
            return
        fin.state = LegState.MEMORY
        self._land(
            flight,
            fin.instance,
            fin.hold,
            lambda: fin.state is LegState.MEMORY,
            lambda: self._main_start(flight),
            lambda: self._skip_turn(flight),
            lambda: flight.done and flight.path.has_handoff,
        )

    def _main_start(self, flight: SimFlight) -> None:
        fin = flight.main
        fin.state = LegState.LANDED
        self.stores[fin.instance].commit(fin.hold, flight.req.hashes)
        path, singular = flight.path, flight.decision.singular
        if flight.done and path.has_handoff and not singular and flight.req.done_hashes:
            # the relay finished first: main still extends, so its cache keeps this turn
            job = Job(
                flight,
                flight.req.output_tokens,
                flight.req.prompt_tokens,
                self._cache_only_extended,
                StepKind.EXTEND,
            )
            self.engines[fin.instance].submit_job(job)
            return
        if flight.done or (singular and path.has_handoff):
            self.release_main(flight)  # the relay finished (or will): only the cache keeps it
            return
        if path.has_handoff and flight.relay.state is LegState.DECODING:
            self.engines[flight.relay.instance].submit_control(
                lambda now: self.handoffs.start(flight, now)
            )
            return
        if path.has_handoff:  # the relay never started: main takes the request over
            flight.handoff = "takeover"
            self.relay_release(flight)
        self.decode_on_main(flight, 0, None)

    def _cache_only_extended(self, job: Job, t: float) -> None:
        flight = job.flight
        fin = flight.main
        if fin.hold is not None and fin.state is LegState.LANDED:
            self.stores[fin.instance].commit_more(fin.hold, flight.req.done_hashes)
        self.release_main(flight)

    def decode_on_main(self, flight: SimFlight, tokens0: int, t_emitted: float | None) -> None:
        out = flight.req.output_tokens
        if t_emitted is not None and tokens0 >= out:
            self.ends.finish_and_release(flight, t_emitted)
            return
        if self.embedded and tokens0 == 0 and out > 1:
            if flight.first_token_at is None:
                flight.first_token_at = self.loop.now  # it emits prefill's first token on landing
            tokens0 = 1
        seq = Seq(
            flight,
            flight.req.rid,
            flight.req.prompt_tokens + tokens0,
            tokens0,
            out,
            self.ends.first_token if tokens0 == 0 else None,
            self.ends.seq_finished,
        )
        self.engines[flight.main.instance].submit_seq(seq)

    def release_main(self, flight: SimFlight) -> None:
        fin = flight.main  # its state first, as the relay's
        hold, fin.hold = fin.hold, None
        if fin.state in (LegState.LANDED, LegState.TRANSFER, LegState.MEMORY):
            landed = fin.state is LegState.LANDED
            fin.state = LegState.RELEASED if landed else LegState.CANCELLED
        if hold is not None:
            self.stores[fin.instance].release(hold)
