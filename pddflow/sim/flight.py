"""A flight: one request from the scheduler's decision to its end, the simulator's twin of the
runtime's `Flight` (docs/structure.md, glossary), and its legs: the prefill's, the relay's and the
main's part (each instance's copy of the KV), each a small record of its own."""

from __future__ import annotations

from enum import Enum

from pddflow.scheduler.decision import Decision
from pddflow.scheduler.topology import PathInfo
from pddflow.sim.engine import Seq
from pddflow.sim.kvstore import Hold
from pddflow.sim.network import Flow
from pddflow.sim.workload import SimRequest


class LegState(Enum):
    NONE = "none"
    TRANSFER = "transfer"
    MEMORY = "memory"  # landed, waiting for the decoder's memory
    DECODING = "decoding"  # the relay decodes it
    LANDED = "landed"  # main holds it
    RELEASED = "released"
    CANCELLED = "cancelled"


class SimPrefillLeg:
    __slots__ = ("instance", "hold", "copies", "hit_tokens", "shipping_s")

    def __init__(self, instance: str):
        self.instance = instance
        self.hold: Hold | None = None
        self.copies = 0  # outgoing KV copies not yet left: the prompt's KV is held until then
        self.hit_tokens = 0  # prompt tokens the prefill instance had cached
        self.shipping_s = 0.0  # the engine's time exporting this prompt's KV after it


class SimRelayLeg:
    __slots__ = ("instance", "hold", "seq", "state", "landed_at", "started_at")

    def __init__(self, instance: str | None):
        self.instance = instance
        self.hold: Hold | None = None
        self.seq: Seq | None = None
        self.state = LegState.NONE
        self.landed_at: float | None = None
        self.started_at: float | None = None  # the relay's loop took it


class SimMainLeg:
    __slots__ = (
        "instance",
        "hold",
        "flow",
        "state",
        "bytes",
        "hit_blocks",
        "sent_at",
        "transfer_s",
    )

    def __init__(self, instance: str):
        self.instance = instance
        self.hold: Hold | None = None
        self.flow: Flow | None = None
        self.state = LegState.NONE
        self.bytes = 0.0
        self.hit_blocks = 0  # leading prompt blocks main had cached when the KV was sent
        self.sent_at = 0.0
        self.transfer_s: float | None = None


class SimFlight:
    __slots__ = (
        "req",
        "decision",
        "path",
        "arrival",
        "prefill_started_at",
        "prefill_done_at",
        "first_token_at",
        "finished_at",
        "done",
        "failed",
        "prefill",
        "relay",
        "main",
        "ids_sent",
        "relay_tokens",
        "handoff",
        "rounds",
        "handing_off",
        "main_waiting",
        "extends_pending",
        "polling",
        "switched",
        "memory_waits",
        "memory_wait_s",
    )

    def __init__(self, req: SimRequest, decision: Decision, path: PathInfo, arrival: float):
        self.req, self.decision, self.path = req, decision, path
        self.arrival = arrival
        self.prefill_started_at: float | None = None
        self.prefill_done_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.done = False
        self.failed: str | None = None
        self.prefill = SimPrefillLeg(decision.target(path.prefill))
        self.relay = SimRelayLeg(decision.target(path.relay) if path.relay else None)
        self.main = SimMainLeg(decision.target(path.main))
        self.ids_sent = 0
        self.relay_tokens = 0
        self.handoff: str | None = None  # one_shot | catch_up | takeover, once it happened
        self.rounds = 0
        # the handoff in progress (sim/handoff.py, cut as the relay worker splits it)
        self.handing_off: str | None = None  # one_shot | catch_up, decided when it starts
        self.main_waiting = False  # main has extended every ID sent
        self.extends_pending = 0  # batches sent and not yet extended over
        self.polling = False  # a check at the relay's next step boundary is queued
        self.switched = False  # an adaptive catch-up the relay's load turned one-shot
        self.memory_waits = 0  # legs whose landed KV waited for decoder memory, and how long
        self.memory_wait_s = 0.0
