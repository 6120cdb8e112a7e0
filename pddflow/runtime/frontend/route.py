"""A flight's route: the instances its legs run on (who prefills, relays and finishes), the handoff
mode between them, and which legs are open."""

from __future__ import annotations

from dataclasses import dataclass, field

from pddflow.graph.plan import Plan
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.scheduler.decision import Decision

RESUMED = "~resumed"  # a resumed request's legs get a new sequence id: old legs' reports differ
HANDOFF_MODES = {"one_shot": pb.HANDOFF_ONE_SHOT, "catch_up": pb.HANDOFF_CATCH_UP}


def mode_name(mode: pb.HandoffMode.ValueType) -> str | None:
    return pb.HandoffMode.Name(mode).removeprefix("HANDOFF_").lower() if mode else None


@dataclass(eq=False)
class Route:
    decision: Decision
    prefill: str = ""
    relay: str = ""
    main: str = ""
    handoff: pb.HandoffMode.ValueType = pb.HANDOFF_NONE
    # an adaptive handoff: its mode is decided when main's KV lands, from the live loads, and
    # the relay re-decides between catch-up batches at this load (0: the mode is fixed)
    catch_up_load: float = 0.0
    legs: set[str] = field(default_factory=set)  # instances holding a live leg
    handed_off: bool = False
    landed: set[str] = field(default_factory=set)  # decoders holding the prompt's KV
    resumed_seq: str = ""  # the sequence id of its legs after it was resumed on another decoder
    resumed_on: set[str] = field(default_factory=set)
    ended: float = 0.0  # when the request ended (main may still extend over the relay's IDs)
    handoff_asked: float = 0.0  # the relay said it hands off (0: main has extended)
    prefill_counted: bool = False  # prefill's times and cache hit are in the metrics

    @staticmethod
    def of(
        plan: Plan, decision: Decision, handoff: str | None = None, catch_up_load: float = 0.0
    ) -> Route:
        """Who prefills, relays and finishes; `handoff` forces the mode (else the decision's,
        re-decided at handoff time when the variant's is adaptive, up to `catch_up_load`)."""
        r = Route(decision)
        for op, inst in decision.targets:
            t = plan.operators[op].type
            if t.prefills:
                r.prefill = inst
            elif t.relays:
                r.relay = inst
            else:
                r.main = inst
        if r.relay and r.main and not decision.singular:
            r.handoff = HANDOFF_MODES[handoff or decision.handoff or "one_shot"]
            if handoff is None and plan.variants[decision.variant].handoff == "adaptive":
                r.catch_up_load = catch_up_load
        return r
