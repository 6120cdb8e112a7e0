"""The router of an API process (`deploy --api-servers N`): the deployment's router, in the
deploying process, routes every request and keeps the scheduler's mirror (Open, Close); the
workers stream this process the tokens of the requests whose connections it holds, one report
per engine step, so no token passes through the router."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pddflow.core.block_hash import chain_block_hashes
from pddflow.core.payloads import SamplingParams
from pddflow.graph.plan import Plan
from pddflow.runtime.frontend.loop_batches import LoopBatches
from pddflow.runtime.frontend.loop_call import call_on_loop
from pddflow.runtime.frontend.model_info import ModelInfo
from pddflow.runtime.frontend.rejection import RequestRejected
from pddflow.runtime.frontend.route import RESUMED
from pddflow.runtime.frontend.token_stream import (
    StreamConflict,
    TokenRun,
    TokenStream,
    stream_chunks,
)
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.rpc import API_SERVER, CALL_TIMEOUT_S, FRONTEND, serve
from pddflow.runtime.wire import logprobs_from_pb, sampling_to_pb
from pddflow.runtime.wiring import Wiring

log = logging.getLogger("pddflow.api")
USAGE_KEPT = 1000  # ended requests whose cached-token count the usage still reads


@dataclass
class _Held:
    """What this process holds of one request beside its stream."""

    stream: TokenStream
    finals: set[str] = field(default_factory=set)  # instances whose tokens said final
    first_instance: str = ""


class RemoteRouter:
    def __init__(self, wiring: Wiring, name: str, model: ModelInfo, stream_interval: int = 1):
        plan: Plan = wiring.plan()
        self.plan, self.name, self.stream_interval = plan, name, stream_interval
        self.model_id = plan.name
        self.tokenizer = model.tokenizer
        self.chat_prompt_ids = model.chat_prompt_ids
        self.tool_format = model.tool_format
        self.vocab_size = model.vocab_size
        self.max_context = min(model.max_context, plan.model.max_context)
        self._prefill_only = {
            i.id for i in plan.instances if plan.operator_of(i.id).type.prefill_only
        }
        self._operator = {i.id: i.operator for i in plan.instances}
        self.credentials = wiring.credentials()
        self.held: dict[str, _Held] = {}
        self.cached: OrderedDict[str, int] = OrderedDict()  # request -> prompt tokens cached
        self._kv_room: int | None = None
        self.batches = LoopBatches()
        self._router_address = wiring.frontend
        self._stubs: tuple[Any, Any, Any] | None = None
        self._closing: set[asyncio.Task] = set()
        address = wiring.api_servers[name]
        self.server, _ = serve(
            API_SERVER,
            self.credentials,
            unary={
                "Fail": (pb.Cancel, pb.Empty, self._fail),
                "Tokens": (pb.Cancel, pb.Progress, self._tokens),
            },
            streams_in={"Reports": (pb.Report, pb.Empty, self._reports)},
            port=int(address.rsplit(":", 1)[1]),
            host=wiring.bind_host(address),
            threads=len(wiring.workers) + 4,
        )

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.batches.attach(loop)

    def max_serving_tokens(self) -> int | None:
        return self._kv_room  # as the router said at the last request's start

    def cached_tokens(self, request_id: str) -> int:
        return self.cached.get(request_id, 0)

    def stopped(self, request_id: str) -> None:
        h = self.held.get(request_id)
        if h is not None:
            h.stream.stopped = True

    # ---- a request -------------------------------------------------------------------------------
    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        deadline: float,
        variant: str | None,
        handoff: str | None,
    ) -> AsyncIterator[list[int]]:
        st = TokenStream(request_id, len(prompt_ids), sampling.max_tokens, variant or "", handoff)
        st.interval = self.stream_interval
        held = self.held[request_id] = _Held(st)  # before its legs start: their tokens come here
        opened = False
        try:
            req = pb.OpenRequest(
                request_id=request_id,
                prompt_ids=prompt_ids,
                sampling=sampling_to_pb(sampling),
                timeout_s=max(0.1, deadline - time.monotonic()),
                variant=variant or "",
                handoff=handoff or "",
                api=self.name,
                block_hashes=chain_block_hashes(prompt_ids, self.plan.model.block_size),
            )
            reply = await self._call(1, req, 2 * CALL_TIMEOUT_S)
            if reply.status:
                raise RequestRejected(reply.status, reply.error, int(reply.retry_after_s) or None)
            opened = True
            self._kv_room = reply.max_serving_tokens or None
            self.cached.setdefault(request_id, reply.predicted_hit_tokens)
            async for chunk in stream_chunks(st, deadline):
                yield chunk
        finally:
            self.held.pop(request_id, None)
            if opened:
                self._close(held)

    def _close(self, held: _Held) -> None:
        st = held.stream
        req = pb.CloseRequest(
            request_id=st.request_id,
            ids=st.tokens,
            sources=st.sources,
            finished=st.finished,
            error=st.error or "",
            stopped=st.stopped,
            finish_reason=st.finish_reason or "",
            token_times=st.token_times,
            finals=sorted(held.finals),
            first_instance=held.first_instance,
        )

        async def close() -> None:
            try:
                await self._call(2, req, CALL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - the router has gone: it ends its legs
                log.warning("the router did not take %s's end: %s", st.request_id, exc)

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        while len(self.cached) > USAGE_KEPT:
            self.cached.popitem(last=False)

    async def _call(self, which: int, message: Any, timeout_s: float) -> Any:
        if self._stubs is None:
            ch = self.credentials.aio_channel(self._router_address)
            stub = ch.unary_unary
            self._stubs = (
                ch,
                stub(
                    f"/{FRONTEND}/Open",
                    request_serializer=pb.OpenRequest.SerializeToString,
                    response_deserializer=pb.OpenReply.FromString,
                ),
                stub(
                    f"/{FRONTEND}/Close",
                    request_serializer=pb.CloseRequest.SerializeToString,
                    response_deserializer=pb.Empty.FromString,
                ),
            )
        return await self._stubs[which](
            message, timeout=timeout_s, metadata=self.credentials.metadata(), wait_for_ready=True
        )

    # ---- the workers' tokens and the router's word (gRPC threads) --------------------------------
    def _reports(self, stream: Any, context: Any) -> pb.Empty:
        try:
            for rep in stream:
                if rep.WhichOneof("body") == "tokens":
                    self.batches.dispatch(lambda r=rep: self._on_tokens(r))
        except Exception:  # noqa: BLE001 - the worker's connection broke; it opens another
            pass
        return pb.Empty()

    def _on_tokens(self, rep: pb.Report) -> None:
        inst = rep.instance
        for t in rep.tokens.tokens:
            rid = t.seq_id.removesuffix(RESUMED)
            h = self.held.get(rid)
            if h is None:  # ended already (main extending over the relay's IDs reports none)
                continue
            st = h.stream
            before = len(st.tokens)
            op = self._operator.get(inst, inst)
            run = TokenRun(
                int(t.start), list(t.ids), op, t.final, logprobs_from_pb(t), t.finish_reason
            )
            if t.start == 0 and t.ids and t.cached_tokens:
                self.cached[rid] = int(t.cached_tokens)
            try:
                st.add(run)
            except StreamConflict as exc:
                st.fail(str(exc))
                continue
            if t.final or inst in self._prefill_only:
                h.finals.add(inst)
            if before == 0 and st.tokens:
                h.first_instance = inst

    def _fail(self, req: pb.Cancel) -> pb.Empty:
        def fail() -> None:
            h = self.held.get(req.seq_id)
            if h is not None:
                h.stream.fail(req.reason)

        self.batches.dispatch(fail)
        return pb.Empty()

    def _tokens(self, req: pb.Cancel) -> pb.Progress:
        def held() -> pb.Progress:
            h = self.held.get(req.seq_id)
            return pb.Progress(ids=h.stream.tokens, known=True) if h else pb.Progress(known=False)

        loop = self.batches.running()
        if loop is None:
            return pb.Progress(known=False)
        return call_on_loop(loop, held, CALL_TIMEOUT_S)

    def close(self) -> None:
        self.server.stop(grace=0.5)
