"""The graph's `autoscale:` section checked against its operators (the planner's bounds)."""

from __future__ import annotations

from pddflow.core.registry import did_you_mean
from pddflow.graph.plan import AutoscalePlan
from pddflow.graph.spec import GraphSpec
from pddflow.graph.yaml_source import Source


def check_autoscale(spec: GraphSpec, src: Source) -> AutoscalePlan:
    """Each `min_replicas` names an operator and lies in 1..its replicas (errors on its line)."""
    a = spec.autoscale
    for name, n in a.min_replicas.items():
        at = ("autoscale", "min_replicas", name)
        op = spec.operators.get(name)
        if op is None:
            src.error(
                at,
                f"autoscale.min_replicas names operator {name!r}, which is not defined"
                f"{did_you_mean(name, spec.operators)}",
                key=True,
            )
        elif not 1 <= n <= op.replicas:
            src.error(
                at,
                f"autoscale.min_replicas of {name} is {n}; the planner scales it within "
                f"min..{op.replicas} (its replicas): set 1..{op.replicas}",
            )
    return AutoscalePlan(**a.model_dump())
