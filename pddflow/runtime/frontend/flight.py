"""A flight: one request from routing to its end at the frontend (its route, its token stream and
timeline, what each leg's order says), and the flights the frontend keeps."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from pddflow.core.leg_lifetimes import LINGER_MAX_S
from pddflow.core.payloads import SamplingParams
from pddflow.graph.plan import Plan
from pddflow.runtime.frontend.route import RESUMED, Route
from pddflow.runtime.frontend.token_stream import TokenStream
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.wire import sampling_to_pb

TIMELINES_KEPT = 1000  # ended flights whose timelines /v1/requests/{id}/timeline still answers
# main's copy of a turn the relay finished still crossing a slow WAN, or queued behind others


@dataclass(eq=False)
class Flight:
    stream: TokenStream
    route: Route
    prompt_ids: list[int]
    sampling: SamplingParams
    deadline: float
    api: str = ""  # the API process streaming it (deploy --api-servers), "" the router's own

    @property
    def request_id(self) -> str:
        return self.stream.request_id

    def order(self, plan: Plan, **over: Any) -> pb.LegOrder:
        """The order that opens this flight's leg on an instance of its route; `over` replaces
        fields (a resumed flight's)."""
        r, s = self.route, self.sampling
        main_blocks = r.decision.predicted_hit_tokens // plan.model.block_size if r.main else 0
        variant = plan.variants[r.decision.variant]
        fields = dict(
            seq_id=self.request_id,
            prompt_ids=self.prompt_ids,
            sampling=sampling_to_pb(s),
            timeout_s=max(0.1, self.deadline - time.monotonic()),
            variant=r.decision.variant,
            prefill=r.prefill,
            relay=r.relay,
            main=r.main,
            handoff=r.handoff,
            main_cached_blocks=main_blocks,
            singular=r.decision.singular,
            catch_up_tokens=variant.catch_up_tokens,
            min_extend_tokens=variant.min_extend_tokens,
            catch_up_load=r.catch_up_load,
            reply_to=self.api,
        )
        fields.update(over)
        return pb.LegOrder(**fields)


class Flights:
    """The flights in the air by request id, and those that ended: their timelines (the most
    recent TIMELINES_KEPT) and, while main still extends over the relay's IDs to keep its cache,
    their routes (lingering). Touched only on the frontend's event loop."""

    def __init__(self) -> None:
        self.live: dict[str, Flight] = {}
        self.resumed: dict[str, str] = {}  # a resumed flight's sequence id -> its request id
        # ended flights' streams, kept for their timelines; a leg that outlives its request
        # (main's KV landing after the relay finished) still adds its events here
        self.done: OrderedDict[str, TokenStream] = OrderedDict()
        self.lingering: OrderedDict[str, Route] = OrderedDict()

    def __len__(self) -> int:
        return len(self.live)

    def __iter__(self):
        return iter(list(self.live.values()))

    def add(self, flight: Flight) -> None:
        self.live[flight.request_id] = flight

    def get(self, seq_id: str) -> Flight | None:
        """The live flight a leg's sequence id belongs to (a resumed leg's too)."""
        return self.live.get(self.resumed.get(seq_id, seq_id))

    def stream(self, seq_id: str) -> TokenStream | None:
        """The stream of the flight, live or ended, that `seq_id` belongs to."""
        flight = self.get(seq_id)
        if flight is not None:
            return flight.stream
        return self.done.get(self.resumed.get(seq_id, seq_id))

    def timeline(self, request_id: str) -> dict[str, Any] | None:
        st = self.stream(request_id)
        return st.timeline() if st else None

    def resume(self, flight: Flight) -> str:
        """A new sequence id for the flight's legs from now on: the old legs' aborts and the new
        order may arrive in any order."""
        seq_id = flight.route.resumed_seq = f"{flight.request_id}{RESUMED}"
        self.resumed[seq_id] = flight.request_id
        return seq_id

    def end(self, flight: Flight) -> None:
        self.live.pop(flight.request_id, None)
        self.done[flight.request_id] = flight.stream
        while len(self.done) > TIMELINES_KEPT:
            request_id, _ = self.done.popitem(last=False)
            self.resumed.pop(f"{request_id}{RESUMED}", None)
            self.lingering.pop(request_id, None)

    def linger(self, flight: Flight) -> None:
        """The flight ended but main still extends over the relay's IDs (its cache keeps the
        turn); main ends that leg itself."""
        flight.route.ended = time.monotonic()
        self.lingering[flight.request_id] = flight.route

    def lingers(self, seq_id: str, now: float) -> bool:
        """Main may still extend over the ended flight `seq_id` (for at most LINGER_MAX_S)."""
        route = self.lingering.get(seq_id)
        if route is None or now - route.ended > LINGER_MAX_S:
            self.lingering.pop(seq_id, None)
            return False
        return True


def finish_reason(flight: Flight) -> str:
    """vLLM's: `stop` (a stop token, or a stop string the API found), `length` (max_tokens),
    `abort` (the client went away, a drain), `error`; or the worker's own (grammar_dead_end)."""
    st = flight.stream
    if st.error:
        return "error"
    if st.stopped:
        return "stop"
    if not st.finished:
        return "abort"
    if st.finish_reason:
        return st.finish_reason
    stops = flight.sampling.stop_token_ids
    if len(st.tokens) < st.max_tokens or (st.tokens and st.tokens[-1] in stops):
        return "stop"
    return "length"


def cached_tokens(timeline: dict[str, Any] | None) -> int:
    """Prompt tokens whose KV came from a prefix cache: what prefill measured (its kv_send
    events), else, when none reached the router (the first token ended the request, or no
    prefill ran apart from the decoder), the scheduler's prediction at arrival."""
    events = (timeline or {}).get("events", [])
    measured = [
        e["cached_tokens"] for e in events if e["event"] == "kv_send" and "cached_tokens" in e
    ]
    if measured:
        return int(max(measured))
    predicted = [e.get("predicted_hit_tokens", 0) for e in events if e["event"] == "arrival"]
    return int(predicted[0]) if predicted else 0
