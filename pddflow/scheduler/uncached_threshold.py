"""The peers' rule (Dynamo, llm-d, SGLang routers; PrfaaS): the second variant when the uncached
prompt tokens exceed a fixed threshold, else the first."""

from __future__ import annotations

from pddflow.scheduler.base import Policy
from pddflow.scheduler.decision import Decision
from pddflow.scheduler.features import RequestFeatures
from pddflow.scheduler.state import SchedulerState


class UncachedThresholdPolicy(Policy):
    name = "uncached_threshold"

    def decide(self, req: RequestFeatures, state: SchedulerState) -> Decision:
        paths = list(self.topo.paths.values())
        first = paths[0]
        inst, hit = self.pick_cached(first.main, req, state)
        uncached = req.prompt_tokens - req.cached_tokens(hit)
        limit = self.params["threshold_tokens"]
        if uncached > limit and len(paths) > 1:
            second = paths[1]
            if second.main == first.main:
                return self.build(
                    second,
                    req,
                    state,
                    main_instance=inst,
                    hit_blocks=hit,
                    reason=f"{uncached} uncached > {limit}",
                )
            return self.build(second, req, state, reason=f"{uncached} uncached > {limit}")
        return self.build(
            first,
            req,
            state,
            main_instance=inst,
            hit_blocks=hit,
            reason=f"{uncached} uncached <= {limit}" if len(paths) > 1 else "single variant",
        )
