"""The default policy: predicted hit and WAN transfer time pick pool, pipeline and handoff mode."""

from __future__ import annotations

from pddflow.scheduler.base import Policy
from pddflow.scheduler.decision import Decision
from pddflow.scheduler.features import RequestFeatures
from pddflow.scheduler.state import SchedulerState
from pddflow.scheduler.topology import PathInfo

RELAY_SATURATED = 1.0  # relay load at which new requests stop being sent to it


class PredictedHitRatePolicy(Policy):
    name = "predicted_hit_rate"

    def decide(self, req: RequestFeatures, state: SchedulerState) -> Decision:
        best = None
        for finisher, paths in self.topo.pools.items():
            inst, hit = self.pick_cached(finisher, req, state)
            hit_tokens = req.cached_tokens(hit)
            direct = [x for x in paths if not x.has_handoff]
            timed = [
                (self.transfer(x, hit_tokens, req, state)[1], i, x)
                for i, x in enumerate(direct or paths)
            ]
            t, _, path = min(timed, key=lambda e: (e[0], e[1]))
            key = (t, state.load(inst))
            if best is None or key < best[0]:
                best = (key, finisher, inst, hit, path, paths)
        (t, _), finisher, inst, hit, direct_path, paths = best
        slow, why_slow, why_not = self._too_slow(t, direct_path, req.cached_tokens(hit), req, state)
        relays = [x for x in paths if x.has_handoff and self._relay_free(x.relay, state)]

        expected_out = self.outputs.expected(req.prompt_tokens, req.max_output_tokens)
        if slow and self._singular(req, expected_out):
            shape = f"{req.prompt_tokens} in / {expected_out} out expected"
            for sp in self.topo.singular_paths:
                if self._relay_free(sp.finisher, state):
                    return self.build(
                        sp,
                        req,
                        state,
                        singular=True,
                        reason=f"singular: {shape}",
                    )
            if relays:
                return self.build(
                    relays[0],
                    req,
                    state,
                    finisher_instance=inst,
                    hit_blocks=hit,
                    singular=True,
                    reason=f"singular on the relay: {shape}",
                )
        if slow and relays:
            return self.build(
                relays[0],
                req,
                state,
                finisher_instance=inst,
                hit_blocks=hit,
                reason=why_slow,
            )
        why = (
            f"relays saturated; {why_slow}"
            if slow and any(x.has_handoff for x in paths)
            else why_not
        )
        return self.build(
            direct_path, req, state, finisher_instance=inst, hit_blocks=hit, reason=why
        )

    def _too_slow(
        self,
        transfer_p90_s: float,
        path: PathInfo,
        hit_tokens: int,
        req: RequestFeatures,
        state: SchedulerState,
    ) -> tuple[bool, str, str]:
        """(would the direct path break the SLA, why it would, why it would not). The SLA rule:
        the finisher goes on after the first token once the entry has queued and prefilled the
        request and the KV has crossed, at the link's P99 (at P90, one in ten P-MD requests
        predicted just inside the SLA broke it: docs/scheduler.md); the fixed P90 transfer
        threshold instead when one is declared."""
        limit = self.params["relay_if_transfer_over_s"]
        if limit > 0:
            head = f"transfer P90 {transfer_p90_s:.2f}s"
            return transfer_p90_s > limit, f"{head} > {limit:g}s", f"{head} <= {limit:g}s"
        transfer_s = self.transfer(path, hit_tokens, req, state, "p99")[1]
        wait = self.prefill_wait_s(self.pick_entry(path.entry, req, state), req, state)
        ttft, sla = wait + transfer_s, self.plan.scheduler.ttft_s
        head = (
            f"{path.name} TTFT {ttft:.2f}s (queue+prefill {wait:.2f}s + transfer P99 "
            f"{transfer_s:.2f}s)"
        )
        return ttft > sla, f"{head} > SLA {sla:g}s", f"{head} <= SLA {sla:g}s"

    def _relay_free(self, relay_op: str | None, state: SchedulerState) -> bool:
        return relay_op is not None and any(
            state.load(i) < RELAY_SATURATED for i in self.plan.operators[relay_op].instances
        )

    def _singular(self, req: RequestFeatures, expected_out: int | None) -> bool:
        p = self.params
        if (
            expected_out is None  # nothing known of its output yet: not worth the relay's time
            or req.prompt_tokens < p["singular_min_prompt_tokens"]
            or expected_out > p["singular_max_output_tokens"]
        ):
            return False
        if not (self.topo.singular_paths or self.topo.has_relay_path):
            return False
        return (self.singular_count + 1) / (self.decided + 1) <= p["singular_max_share"]
