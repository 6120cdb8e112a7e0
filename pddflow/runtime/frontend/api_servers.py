"""The router's side of `deploy --api-servers N`: the API processes that hold the clients'
connections. Each asks the router to route a request (Open) and says when it ended (Close); the
workers stream it the request's tokens directly; the router tells it of a failure (Fail) and,
to resume a request elsewhere, asks what it holds (Tokens). Calls run on the router's loop."""

from __future__ import annotations

import asyncio
import logging
from itertools import pairwise
from typing import Any

from pddflow.runtime.frontend.flight import Flight
from pddflow.runtime.frontend.metrics import Metrics
from pddflow.runtime.frontend.rejection import RequestRejected
from pddflow.runtime.frontend.token_stream import TimelineEvent
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.rpc import API_SERVER, CALL_TIMEOUT_S, Credentials, grpc_text
from pddflow.runtime.wiring import Wiring

log = logging.getLogger("pddflow.frontend")


class ApiServers:
    def __init__(self, wiring: Wiring, credentials: Credentials):
        self.addresses = dict(wiring.api_servers)
        self.credentials = credentials
        self._stubs: dict[str, tuple[Any, Any, Any]] = {}  # name -> (channel, Fail, Tokens)
        self._tasks: set[asyncio.Task] = set()

    def _stub(self, name: str) -> tuple[Any, Any, Any]:
        got = self._stubs.get(name)
        if got is None:
            ch = self.credentials.aio_channel(self.addresses[name])
            fail = ch.unary_unary(
                f"/{API_SERVER}/Fail",
                request_serializer=pb.Cancel.SerializeToString,
                response_deserializer=pb.Empty.FromString,
            )
            tokens = ch.unary_unary(
                f"/{API_SERVER}/Tokens",
                request_serializer=pb.Cancel.SerializeToString,
                response_deserializer=pb.Progress.FromString,
            )
            got = self._stubs[name] = (ch, fail, tokens)
        return got

    def fail(self, name: str, request_id: str, error: str) -> None:
        """Tell API process `name` that its request failed (it answers the client and closes)."""

        async def call() -> None:
            try:
                await self._stub(name)[1](
                    pb.Cancel(seq_id=request_id, reason=error),
                    timeout=CALL_TIMEOUT_S,
                    metadata=self.credentials.metadata(),
                )
            except Exception as exc:  # noqa: BLE001 - it went away: its requests end with it
                log.warning("API process %s did not take %s's failure: %s", name, request_id, exc)

        task = asyncio.get_running_loop().create_task(call())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def tokens(self, name: str, request_id: str) -> list[int] | None:
        """The tokens API process `name` holds of the request (None: it holds none, or it did not
        answer)."""
        try:
            got = await self._stub(name)[2](
                pb.Cancel(seq_id=request_id),
                timeout=CALL_TIMEOUT_S,
                metadata=self.credentials.metadata(),
            )
        except Exception as exc:  # noqa: BLE001 - it went away
            log.warning(
                "API process %s did not say %s's tokens: %s", name, request_id, grpc_text(exc)
            )
            return None
        return list(got.ids) if got.known else None

    async def close(self) -> None:
        for ch, _, _ in self._stubs.values():
            await ch.close()
        self._stubs.clear()


def rejection(exc: RequestRejected) -> pb.OpenReply:
    return pb.OpenReply(status=exc.status, error=str(exc), retry_after_s=exc.retry_after_s or 0)


def ended_remotely(flight: Flight, req: pb.CloseRequest) -> None:
    """The router's stream of the flight as the API process's ended; the legs whose tokens said
    final are over."""
    st = flight.stream
    st.tokens, st.sources = list(req.ids), list(req.sources)
    st.logprobs = [None] * len(st.tokens)
    st.token_times = list(req.token_times)
    st.emitted = len(st.tokens)
    st.finished, st.stopped = req.finished, req.stopped
    st.error = req.error or None
    st.finish_reason = req.finish_reason or None
    for inst in req.finals:
        flight.route.legs.discard(inst)
    if st.token_times:
        first = {"instance": req.first_instance} if req.first_instance else {}
        timed = [TimelineEvent("first_token", st.token_times[0], first)]
        if st.finished and not st.error:
            timed.append(TimelineEvent("finish", st.token_times[-1], {"tokens": len(st.tokens)}))
        st.events = sorted(st.events + timed, key=lambda e: e.at)


def count_remote(metrics: Metrics, flight: Flight, relays: dict[str, bool]) -> None:
    """A remotely streamed flight's token metrics, as the router counts its own per report:
    time to the first token, the gaps between steps, tokens by operator."""
    st = flight.stream
    times = st.token_times
    if not times:
        return
    ttft = times[0] - st.arrival
    metrics.ttft.observe(ttft)
    metrics.vllm.first_token(ttft, st.prompt_len)
    metrics.vllm.tokens(len(times), None)
    for a, b in pairwise(times):
        if b > a:  # tokens of one report share its time
            metrics.itl.observe(b - a)
            metrics.vllm.tokens(0, b - a)
    for op in dict.fromkeys(st.sources):
        metrics.count_tokens(op, st.sources.count(op), relays.get(op, False))
