"""A prompt's KV on its way to the decoders: the relay's copy over RDMA and the finisher's over the
WAN (or RDMA), their landing (memory reserved only then, as the runtime does) and release."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pddflow.sim.engine import Job, Seq, StepKind
from pddflow.sim.kvstore import Hold
from pddflow.sim.network import RDMA_LATENCY_S
from pddflow.sim.run import LegState, Run

if TYPE_CHECKING:
    from pddflow.sim.simulator import Simulation

    _Base = Simulation
else:
    _Base = object

_LIVE = (LegState.TRANSFER, LegState.MEMORY, LegState.DECODING)


class DecodeLegs(_Base):
    def _land(
        self,
        run: Run,
        inst: str,
        hold: Hold,
        waiting: Callable[[], bool],
        then: Callable[[], None],
        drop: Callable[[], None],
    ) -> None:
        """Reserve the rest of the prompt and the whole output now or, FIFO, when memory frees.
        `waiting()` says the leg still wants the memory; if not, `drop()` it."""
        store = self.stores[inst]
        extra = -(-run.req.output_tokens // self.block_tokens)
        landed = self.loop.now

        def attempt() -> bool:
            if not waiting():
                drop()
                return True
            try:
                if not store.reserve(hold, extra):
                    return False
            except ValueError as exc:
                self._fail(run, str(exc))
                return True
            run.memory_wait_s += self.loop.now - landed
            ready = store.load_deferred(hold)  # host-tier blocks of its hit, into the room
            if ready > self.loop.now:
                # the leg may be cancelled while they load (a singular request's relay finished)
                self.loop.at(ready, lambda: then() if waiting() else drop())
            else:
                then()
            return True

        if store.waiters or not attempt():
            run.memory_waits += 1
            store.wait(attempt)

    def _relay_send(self, run: Run) -> None:
        run.relay.state = LegState.TRANSFER
        nbytes = self._kv_bytes(run.req.prompt_tokens, 0)
        rate = self.topo.rdma_bytes_per_s(run.path.entry, run.path.relay)
        self.loop.after(RDMA_LATENCY_S + nbytes / rate, self._relay_landed, run)

    def _relay_landed(self, run: Run) -> None:
        self._copy_left(run)
        run.relay.landed_at = self.loop.now
        # as a worker, a busy decoder takes landed KV (and shows its first token) at a boundary
        self.engines[run.relay.instance].submit_control(lambda _now: self._relay_import(run))

    def _relay_import(self, run: Run) -> None:
        leg = run.relay
        if leg.state is not LegState.TRANSFER or run.done or leg.hold is None:
            self._relay_release(run)
            return
        leg.state = LegState.MEMORY
        self._land(
            run,
            leg.instance,
            leg.hold,
            lambda: leg.state is LegState.MEMORY and not run.done,
            lambda: self._relay_start(run),
            lambda: self._relay_release(run),
        )

    def _relay_start(self, run: Run) -> None:
        leg = run.relay
        self.stores[leg.instance].commit(leg.hold, run.req.hashes)
        leg.state = LegState.DECODING
        leg.started_at = self.loop.now
        first = 1 if self.embedded and run.req.output_tokens > 1 else 0
        if first and run.first_token_at is None:
            run.first_token_at = self.loop.now  # the relay emits prefill's first token on landing
        leg.seq = Seq(
            run,
            run.req.rid,
            run.req.prompt_tokens + first,
            first,
            run.req.output_tokens,
            None if first else self._first,
            self._relay_finished,
        )
        self.engines[leg.instance].submit_seq(leg.seq)

    def _relay_release(self, run: Run) -> None:
        # the leg's state first: a release wakes memory waiters at once, this leg's own landing
        # among them, which must see it released (it reserved and started a released relay)
        leg = run.relay
        hold, leg.hold = leg.hold, None
        if leg.state in _LIVE:
            decoding = leg.state is LegState.DECODING
            leg.state = LegState.RELEASED if decoding else LegState.CANCELLED
        if hold is not None:
            self.stores[leg.instance].release(hold)

    def _relay_finished(self, seq: Seq, t: float) -> None:
        """Singular traffic, or an output shorter than the transfer."""
        run = seq.run
        run.relay_tokens = run.req.output_tokens
        self._relay_release(run)
        self._finish(run, t)
        fin = run.finisher
        if run.decision.singular and fin.state in (LegState.MEMORY, LegState.TRANSFER):
            if fin.flow is not None:
                fin.bytes = self.links[run.path.wan_link].cancel(fin.flow)
                self._copy_left(run)
            elif fin.state is LegState.TRANSFER:
                return  # an RDMA leg: it lands on its own
            fin.state = LegState.CANCELLED
            self._finisher_release(run)

    def _finisher_send(self, run: Run) -> None:
        fin = run.finisher
        fin.state = LegState.TRANSFER
        fin.hit_blocks = fin.hold.hit
        nbytes = self._kv_bytes(run.req.prompt_tokens, fin.hit_blocks)
        fin.bytes = nbytes
        fin.sent_at = self.loop.now
        link = run.path.wan_link
        if link is not None:
            fin.flow = self.links[link].send(nbytes, lambda t: self._finisher_landed(run))
        else:
            rate = self.topo.rdma_bytes_per_s(run.path.entry, run.path.finisher)
            self.loop.after(RDMA_LATENCY_S + nbytes / rate, self._finisher_landed, run)

    def _finisher_landed(self, run: Run) -> None:
        self._copy_left(run)
        fin = run.finisher
        fin.flow = None
        if fin.state is not LegState.TRANSFER:
            return
        fin.transfer_s = self.loop.now - fin.sent_at
        # taken at a step boundary, as the relay's
        self.engines[fin.instance].submit_control(lambda _now: self._finisher_import(run))

    def _finisher_import(self, run: Run) -> None:
        fin = run.finisher
        if fin.state is not LegState.TRANSFER or fin.hold is None:
            return
        if fin.hold.ready_at > self.loop.now:
            # its cached prefix is still loading from the host tier: import once it is in HBM
            eng = self.engines[fin.instance]
            self.loop.at(
                fin.hold.ready_at, eng.submit_control, lambda _now: self._finisher_import(run)
            )
            return
        fin.state = LegState.MEMORY
        self._land(
            run,
            fin.instance,
            fin.hold,
            lambda: fin.state is LegState.MEMORY,
            lambda: self._finisher_start(run),
            lambda: self._finisher_release(run),
        )

    def _finisher_start(self, run: Run) -> None:
        fin = run.finisher
        fin.state = LegState.LANDED
        self.stores[fin.instance].commit(fin.hold, run.req.hashes)
        path, singular = run.path, run.decision.singular
        if run.done and path.has_handoff and not singular and run.req.done_hashes:
            # the relay finished first: the finisher still extends, so its cache keeps this turn
            job = Job(
                run,
                run.req.output_tokens,
                run.req.prompt_tokens,
                self._cache_only_extended,
                StepKind.EXTEND,
            )
            self.engines[fin.instance].submit_job(job)
            return
        if run.done or (singular and path.has_handoff):
            self._finisher_release(run)  # the relay finished (or will): only the cache keeps it
            return
        if path.has_handoff and run.relay.state is LegState.DECODING:
            self.engines[run.relay.instance].submit_control(lambda now: self._handoff(run, now))
            return
        if path.has_handoff:  # the relay never started: the finisher takes the request over
            run.handoff = "takeover"
            self._relay_release(run)
        self._finisher_decode(run, 0, None)

    def _cache_only_extended(self, job: Job, t: float) -> None:
        run = job.run
        fin = run.finisher
        if fin.hold is not None and fin.state is LegState.LANDED:
            self.stores[fin.instance].commit_more(fin.hold, run.req.done_hashes)
        self._finisher_release(run)

    def _finisher_decode(self, run: Run, tokens0: int, t_emitted: float | None) -> None:
        out = run.req.output_tokens
        if t_emitted is not None and tokens0 >= out:
            self._finished_at(run, t_emitted)
            return
        if self.embedded and tokens0 == 0 and out > 1:
            if run.first_token_at is None:
                run.first_token_at = self.loop.now  # it emits prefill's first token on landing
            tokens0 = 1
        seq = Seq(
            run,
            run.req.rid,
            run.req.prompt_tokens + tokens0,
            tokens0,
            out,
            self._first if tokens0 == 0 else None,
            self._finished,
        )
        self.engines[run.finisher.instance].submit_seq(seq)

    def _finisher_release(self, run: Run) -> None:
        fin = run.finisher  # its state first, as the relay's
        hold, fin.hold = fin.hold, None
        if fin.state in (LegState.LANDED, LegState.TRANSFER, LegState.MEMORY):
            landed = fin.state is LegState.LANDED
            fin.state = LegState.RELEASED if landed else LegState.CANCELLED
        if hold is not None:
            self.stores[fin.instance].release(hold)
