"""A flight's token stream at the frontend: tokens from several workers merged by position into one
stream, no token repeated or lost; plus the flight's timeline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from pddflow.core.payloads import TokenChunk, TokenLogprob


@dataclass
class TokenRun:
    start: int  # position in the output (0 = first generated token)
    ids: list[int]
    source: str  # operator name
    final: bool = False  # the source produced the sequence's last token
    logprobs: list[TokenLogprob] | None = None  # parallel to ids, when the request asked
    finish_reason: str = ""  # with final: why the source ended the sequence


@dataclass(frozen=True)
class TimelineEvent:
    name: str
    at: float  # monotonic
    detail: dict[str, Any]


class StreamConflict(Exception):
    """Two workers disagree about the token at one position: a correctness bug, never ignored."""


@dataclass
class TokenStream:
    request_id: str
    prompt_len: int
    max_tokens: int
    variant: str
    handoff: str | None
    arrival: float = field(default_factory=time.monotonic)
    tokens: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob | None] = field(default_factory=list)  # parallel to tokens
    # positions beyond a gap: (token, source, its logprob)
    ahead: dict[int, tuple[int, str, TokenLogprob | None]] = field(default_factory=dict)
    end: int = 0  # output length: max_tokens, or less once a source says final
    finished: bool = False
    error: str | None = None
    events: list[TimelineEvent] = field(default_factory=list)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    emitted: int = 0
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # why the output ended: the final run's reason
    stopped: bool = False  # the API found a stop string and ended the output
    _told_finish: bool = False  # take_new has handed the finish reason on
    interval: int = 1  # tokens a chunk waits for (deploy --stream-interval); the first goes alone
    # told of a failure (the router's stream of an API process's request: it tells that process)
    on_fail: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self.end = self.max_tokens

    def event(self, name: str, **detail: Any) -> None:
        self.events.append(TimelineEvent(name, time.monotonic(), detail))

    def add(self, run: TokenRun) -> None:
        """Any position; one reported twice (around the handoff) must carry the same token."""
        if self.finished:
            return
        for i, tok in enumerate(run.ids):
            pos = run.start + i
            seen = (
                self.tokens[pos]
                if pos < len(self.tokens)
                else self.ahead.get(pos, (None, "", None))[0]
            )
            if seen is not None and seen != tok:
                where = self.sources[pos] if pos < len(self.sources) else self.ahead[pos][1]
                raise StreamConflict(
                    f"{self.request_id}: output position {pos} is {seen} from {where} "
                    f"but {tok} from {run.source}"
                )
            if pos >= len(self.tokens):  # the first writer's token and logprob win
                lp = run.logprobs[i] if run.logprobs and i < len(run.logprobs) else None
                self.ahead.setdefault(pos, (tok, run.source, lp))
        if run.final:
            if run.start + len(run.ids) < self.end or self.finish_reason is None:
                self.finish_reason = run.finish_reason or self.finish_reason
            self.end = min(self.end, run.start + len(run.ids))
        now = time.monotonic()
        while len(self.tokens) in self.ahead and len(self.tokens) < self.end:
            tok, source, lp = self.ahead.pop(len(self.tokens))
            self.tokens.append(tok)
            self.sources.append(source)
            self.logprobs.append(lp)
            self.token_times.append(now)
        if len(self.tokens) >= self.end:
            self.finished = True
            self.ahead.clear()
            self.event("finish", tokens=len(self.tokens))
        if self.ready():  # the reader wakes when a chunk is due, not on every report
            self.wakeup.set()

    def fail(self, message: str) -> None:
        if not self.finished:
            self.error = message
            self.finished = True
            self.event("failed", error=message)
            self.wakeup.set()
            if self.on_fail is not None:
                self.on_fail(message)

    def ready(self) -> bool:
        """Whether a chunk is due: the first token at once, then `interval` new tokens, and
        whatever is left (or only the finish reason) once the stream has finished."""
        new = len(self.tokens) - self.emitted
        if self.finished:
            return bool(new) or (not self.error and not self._told_finish)
        return new >= self.interval or (new > 0 and self.emitted == 0)

    def take_new(self) -> TokenChunk:
        """The tokens not taken yet; once the stream has finished, the chunk that takes its last
        token (or an empty one after it) carries the finish reason, once."""
        out = TokenChunk(self.tokens[self.emitted :], self.logprobs[self.emitted :])
        self.emitted = len(self.tokens)
        if self.finished and not self.error and not self._told_finish:
            out.finish_reason, self._told_finish = self.finish_reason, True
        return out

    def timeline(self) -> dict[str, Any]:
        t0 = self.arrival
        return {
            "request_id": self.request_id,
            "variant": self.variant,
            "handoff": self.handoff,
            "prompt_tokens": self.prompt_len,
            "output_tokens": len(self.tokens),
            "finished": self.finished,
            "error": self.error,
            "tokens_by_operator": {s: self.sources.count(s) for s in dict.fromkeys(self.sources)},
            "events": [
                {"event": e.name, "t_ms": round((e.at - t0) * 1e3, 3), **e.detail}
                for e in self.events
            ],
        }


async def stream_chunks(st: TokenStream, deadline: float) -> AsyncIterator[TokenChunk]:
    """The stream's chunks as they come due, until it finishes; RequestRejected when it failed
    (502) or passed `deadline` (504). Tokens are added on the same loop."""
    from pddflow.runtime.frontend.rejection import RequestRejected

    # one timer for the whole stream, not one per wait (the loop may run it a little early)
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        st.wakeup.set()

    timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), expire)
    try:
        while True:
            if st.ready():
                yield st.take_new()
                continue  # what came while the reader had the chunk is looked at before a wait
            if st.finished and st.emitted == len(st.tokens):
                break
            if st.error:
                raise RequestRejected(502, st.error)
            if expired or time.monotonic() >= deadline:
                st.fail("deadline passed")
                raise RequestRejected(504, f"request {st.request_id} passed its deadline")
            st.wakeup.clear()  # reports land on this loop: nothing can slip in before the wait
            await st.wakeup.wait()  # set when a chunk is due (TokenStream.add), or by the timer
    finally:
        timer.cancel()
    if st.error:
        raise RequestRejected(502, st.error)
