"""The relay's token-ID handoff to the finisher, one-shot or in catch-up rounds."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pddflow.sim.engine import Job, StepKind
from pddflow.sim.network import IDS_BYTES_PER_TOKEN, RDMA_LATENCY_S
from pddflow.sim.run import Run

if TYPE_CHECKING:
    from pddflow.sim.simulator import Simulation

    _Base = Simulation
else:
    _Base = object


class Handoffs(_Base):
    def _handoff(self, run: Run, now: float) -> None:
        if run.done:
            self._finisher_release(run)
            return
        relay = self.engines[run.relay.instance]
        seq = run.relay.seq
        if not relay.is_running(seq):  # still queued for a batch slot: the finisher takes over
            relay.remove(seq)
            run.handoff = "takeover"
            self._relay_release(run)
            self._finisher_decode(run, 0, None)
            return
        n = relay.generated(seq)
        new = n - run.ids_sent
        final = run.decision.handoff != "catch_up" or new <= run.path.variant.catch_up_tokens
        ctx = run.req.prompt_tokens + run.ids_sent
        if final:
            relay.remove(seq)
            run.relay_tokens = n
            run.handoff = run.decision.handoff or "one_shot"
            self._relay_release(run)
        run.ids_sent = n
        run.rounds += 1
        done = self._extended_final if final else self._extended_round
        finisher = self.engines[run.finisher.instance]
        self._ids(
            run, new, lambda t: finisher.submit_job(Job(run, new, ctx, done, StepKind.EXTEND))
        )

    def _ids(self, run: Run, ntokens: int, then: Callable[[float], None]) -> None:
        ch = run.path.handoff
        nbytes = max(ntokens, 1) * IDS_BYTES_PER_TOKEN
        if ch is not None and ch.link is not None:
            self.links[ch.link].message(nbytes, then)
        else:
            self.loop.after(RDMA_LATENCY_S, lambda: then(self.loop.now))

    def _extended_round(self, job: Job, t: float) -> None:
        run = job.run
        if run.done:
            self._finisher_release(run)
            return
        # the finisher acks; the relay checks at its next boundary how far ahead it has run
        relay = self.engines[run.relay.instance]
        self._ids(run, 1, lambda _t: relay.submit_control(lambda now: self._handoff(run, now)))

    def _extended_final(self, job: Job, t: float) -> None:
        """The extend over the last handed-off IDs also yields the next token."""
        run = job.run
        self._finisher_decode(run, run.relay_tokens + 1, t)
