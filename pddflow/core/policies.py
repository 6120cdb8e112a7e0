"""Scheduler policy names and parameters, below the graph layer so validation imports no scheduler;
`impl` ("module:attribute" in `pddflow.scheduler`) is loaded by the runtime and the simulator."""

from __future__ import annotations

from dataclasses import dataclass, field

from pddflow.core.operator_types import Param
from pddflow.core.registry import Registry


@dataclass(frozen=True)
class PolicySpec:
    name: str
    help: str
    impl: str
    params: dict[str, Param] = field(default_factory=dict)


POLICIES: Registry[PolicySpec] = Registry("scheduler policy", "pddflow.policies")

POLICIES.register(
    "predicted_hit_rate",
    PolicySpec(
        "predicted_hit_rate",
        "per request: the direct path's predicted TTFT (prefill queue and rate, the KV the "
        "main's radix cache lacks, the live link estimate's P90) against the SLA picks "
        "p_md or p_rld_md; the relay's live load picks the handoff mode at handoff time; "
        "singular traffic",
        "pddflow.scheduler.predicted_hit_rate:PredictedHitRatePolicy",
        {
            "relay_if_transfer_over_s": Param(
                float,
                0.5,
                "also use the relay when the predicted P90 KV transfer exceeds this many seconds "
                "(0: only when the direct path's predicted TTFT breaks scheduler.sla.ttft_s)",
            ),
            "singular_min_prompt_tokens": Param(
                int, 16384, "singular traffic: prompts at least this long ..."
            ),
            "singular_max_output_tokens": Param(
                int, 500, "... with expected outputs at most this short"
            ),
            "singular_max_share": Param(
                float, 0.04, "most requests finished on the relay as singular traffic"
            ),
            "catch_up_load": Param(
                float, 0.7, "adaptive handoff: relay load above which one-shot is used"
            ),
        },
    ),
)
POLICIES.register(
    "uncached_threshold",
    PolicySpec(
        "uncached_threshold",
        "what Dynamo/llm-d/SGLang routers do: relay (remote prefill) when uncached prompt "
        "tokens exceed a fixed threshold",
        "pddflow.scheduler.uncached_threshold:UncachedThresholdPolicy",
        {
            "threshold_tokens": Param(
                int, 2048, "uncached prompt tokens above which the second variant is taken"
            )
        },
    ),
)
POLICIES.register(
    "first_variant",
    PolicySpec(
        "first_variant",
        "every request takes the first variant listed (single-pipeline baselines)",
        "pddflow.scheduler.first_variant:FirstVariantPolicy",
    ),
)
