"""Every request takes the first variant; instances are still chosen cache-aware."""

from __future__ import annotations

from pddflow.scheduler.base import Policy
from pddflow.scheduler.decision import Decision
from pddflow.scheduler.features import RequestFeatures
from pddflow.scheduler.state import SchedulerState


class FirstVariantPolicy(Policy):
    name = "first_variant"

    def decide(self, req: RequestFeatures, state: SchedulerState) -> Decision:
        return self.build(next(iter(self.topo.paths.values())), req, state, reason="first variant")
