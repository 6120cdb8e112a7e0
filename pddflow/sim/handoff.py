"""The relay's token-ID handoff to the finisher, cut into batches by `core/handoff_cut.py` exactly
as the relay worker cuts it: checked at each relay step boundary and whenever the finisher has
extended every batch it was sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pddflow.core.handoff_cut import HandoffCut, HandoffStep
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
        """The finisher holds the prompt's KV: the handoff starts (an adaptive one's mode is
        decided now, from the relay's load now)."""
        if run.done:
            self._finisher_release(run)
            return
        relay = self.engines[run.relay.instance]
        if not relay.is_running(run.relay.seq):  # still queued for a batch slot: take it over
            relay.remove(run.relay.seq)
            run.handoff = "takeover"
            self._relay_release(run)
            self._finisher_decode(run, 0, None)
            return
        mode = run.decision.handoff or "one_shot"
        if run.path.variant.handoff == "adaptive":
            self.state.set_load(run.relay.instance, self._instance_load(run.relay.instance))
            mode = self.policy.handoff_mode(run.path, run.relay.instance, self.state) or mode
        run.handing_off, run.main_waiting = mode, True
        self._advance(run, now)

    def _cut(self, run: Run) -> HandoffCut:
        v = run.path.variant
        adaptive = v.handoff == "adaptive"
        return HandoffCut(
            v.catch_up_tokens,
            v.min_extend_tokens,
            self.policy.params.get("catch_up_load", 0.0) if adaptive else 0.0,
        )

    def _poll(self, run: Run) -> None:
        """Check again after the relay's next step (one check queued at a time)."""
        if not run.polling:
            run.polling = True
            relay = self.engines[run.relay.instance]
            relay.submit_after_step(lambda now: self._advance(run, now))

    def _advance(self, run: Run, now: float) -> None:
        run.polling = False
        if run.done:
            self._finisher_release(run)
            return
        if run.handing_off is None or run.relay_tokens:  # not started, or the final batch went
            return
        relay = self.engines[run.relay.instance]
        seq = run.relay.seq
        n = relay.generated(seq)
        unsent = n - run.ids_sent
        cut, load = self._cut(run), self._instance_load(run.relay.instance).load
        step = cut.step(
            run.handing_off,
            unsent,
            finished=False,
            main_waiting=run.main_waiting,
            relay_load=load,
        )
        if step is HandoffStep.WAIT:
            self._poll(run)
            return
        ctx = run.req.prompt_tokens + run.ids_sent
        run.ids_sent = n
        run.rounds += 1
        finisher = self.engines[run.finisher.instance]
        if step is HandoffStep.FINAL:
            run.switched = cut.switched(
                run.handing_off, unsent, main_waiting=run.main_waiting, relay_load=load
            )
            relay.remove(seq)
            run.relay_tokens = n
            run.handoff = "one_shot" if run.switched else run.handing_off
            self._relay_release(run)
            job = Job(run, unsent, ctx, self._extended_final, StepKind.EXTEND)
            self._ids(run, unsent, lambda t: finisher.submit_job(job))
            return
        run.main_waiting = False
        run.extends_pending += 1
        job = Job(run, unsent, ctx, self._extended_round, StepKind.EXTEND)
        self._ids(run, unsent, lambda t: finisher.submit_job(job))
        self._poll(run)

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
        run.extends_pending -= 1
        if run.extends_pending or run.relay_tokens:
            return

        # caught up: the finisher says so; the relay reads it at its next step boundary
        def caught_up(_t: float) -> None:
            run.main_waiting = True
            self._poll(run)

        self._ids(run, 1, caught_up)

    def _extended_final(self, job: Job, t: float) -> None:
        """The extend over the last handed-off IDs also yields the next token."""
        run = job.run
        self._finisher_decode(run, run.relay_tokens + 1, t)
