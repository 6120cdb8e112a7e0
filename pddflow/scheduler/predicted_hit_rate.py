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
        for main, paths in self.topo.pools.items():
            inst, hit = self.pick_cached(main, req, state)
            hit_tokens = req.cached_tokens(hit)
            load_s = self.tier_load_s(inst, req, hit, state)  # the hit below the device, if any
            direct = [x for x in paths if not x.has_handoff]
            timed = [
                (self.transfer(x, hit_tokens, req, state)[1] + load_s, i, x)
                for i, x in enumerate(direct or paths)
            ]
            t, _, path = min(timed, key=lambda e: (e[0], e[1]))
            key = (t, state.load(inst))
            if best is None or key < best[0]:
                best = (key, main, inst, hit, path, paths)
        (t, _), main, inst, hit, direct_path, paths = best
        slow, why_slow, why_not = self._too_slow(t, direct_path, req.cached_tokens(hit), req, state)
        relays = [x for x in paths if x.has_handoff and self._relay_free(x.relay, state)]

        expected_out = self.outputs.expected(req.prompt_tokens, req.max_output_tokens)
        if slow and self._singular(req, expected_out):
            shape = f"{req.prompt_tokens} in / {expected_out} out expected"
            for sp in self.topo.singular_paths:
                if self._relay_free(sp.main, state):
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
                    main_instance=inst,
                    hit_blocks=hit,
                    singular=True,
                    reason=f"singular on the relay: {shape}",
                )
        if slow and relays:
            return self.build(
                relays[0],
                req,
                state,
                main_instance=inst,
                hit_blocks=hit,
                reason=why_slow,
            )
        why = (
            f"relays saturated; {why_slow}"
            if slow and any(x.has_handoff for x in paths)
            else (why_not or why_slow)
        )
        return self.build(direct_path, req, state, main_instance=inst, hit_blocks=hit, reason=why)

    def _too_slow(
        self,
        transfer_p90_s: float,
        path: PathInfo,
        hit_tokens: int,
        req: RequestFeatures,
        state: SchedulerState,
    ) -> tuple[bool, str, str]:
        """(should the relay hide the WAN, why, why not). Two rules, either suffices: the KV's
        P90 transfer exceeds `relay_if_transfer_over_s` (0: off), or the direct path's predicted
        TTFT breaks the SLA: the prefill instance's queue and this prompt's prefill at its measured
        rate, then the transfer at the link's P99 (at P90 one in ten P-MD requests predicted just
        inside the SLA broke it). docs/scheduler.md has what each costs."""
        limit = self.params["relay_if_transfer_over_s"]
        transfer_s = self.transfer(path, hit_tokens, req, state, "p99")[1]
        wait = self.prefill_wait_s(self.pick_prefill(path.prefill, req, state), req, state)
        ttft, sla = wait + transfer_s, self.plan.scheduler.ttft_s
        sla_why = (
            f"{path.name} TTFT {ttft:.2f}s (queue+prefill {wait:.2f}s + transfer P99 "
            f"{transfer_s:.2f}s)"
        )
        if ttft > sla:
            return True, f"{sla_why} > SLA {sla:g}s", ""
        fixed = f"transfer P90 {transfer_p90_s:.2f}s"
        if 0 < limit < transfer_p90_s:
            return True, f"{fixed} > {limit:g}s ({sla_why} <= SLA {sla:g}s)", ""
        below = f"{fixed} <= {limit:g}s; " if limit > 0 else ""
        return False, "", f"{below}{sla_why} <= SLA {sla:g}s"

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
