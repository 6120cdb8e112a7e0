"""Scheduling policy, pure (no I/O, threads or torch): features in, decision out."""

from __future__ import annotations

import importlib
from typing import Any

from pddflow.core.policies import POLICIES
from pddflow.graph.plan import Plan
from pddflow.scheduler.base import Policy
from pddflow.scheduler.decision import Decision
from pddflow.scheduler.features import InstanceLoad, LinkEstimate, RequestFeatures
from pddflow.scheduler.mirror import CacheMirror, MirrorDrift
from pddflow.scheduler.state import SchedulerState
from pddflow.scheduler.topology import PathInfo, Topology

__all__ = [
    "CacheMirror",
    "Decision",
    "InstanceLoad",
    "LinkEstimate",
    "MirrorDrift",
    "PathInfo",
    "Policy",
    "RequestFeatures",
    "SchedulerState",
    "Topology",
    "make_policy",
]


def make_policy(plan: Plan, params: dict[str, Any] | None = None) -> Policy:
    """The plan's policy, with the plan's parameters and `params` on top."""
    spec = POLICIES.get(plan.scheduler.policy)
    module, _, attr = spec.impl.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ImportError(
            f"scheduler policy {spec.name!r}: cannot load {spec.impl!r} ({exc})"
        ) from exc
    return cls(plan, params)
