"""The generation requests being served, for a bounded drain at shutdown (docs/runtime.md,
Stopping)."""

from __future__ import annotations

import asyncio
from typing import Any

from pddflow.runtime.frontend.rejection import RequestRejected


class Admission:
    """The generation requests being served, so that a shutdown can drain them (docs/runtime.md,
    Stopping): once `drain` starts, new requests get 503; those running may finish until the
    drain's timeout, then the rest are aborted, each client told why."""

    def __init__(self) -> None:
        self.refusal: str | None = None  # why new requests are refused; None while open
        self.completions: set[Any] = set()  # completion.Completion
        self._changed = asyncio.Event()

    @property
    def open(self) -> bool:
        return self.refusal is None

    def admit(self, completion: Any) -> None:
        if self.refusal is not None:
            raise RequestRejected(503, self.refusal)
        self.completions.add(completion)

    def leave(self, completion: Any) -> None:
        self.completions.discard(completion)
        self._changed.set()

    async def drain(self, timeout_s: float) -> int:
        """Refuse new requests, wait up to timeout_s for the running ones, abort the rest; returns
        how many were aborted."""
        self.refusal = "the server is shutting down; it takes no new requests"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.completions and loop.time() < deadline:
            await self._changes(deadline - loop.time())
        return await self.abort_all(
            f"the server is shutting down and this request did not finish within its drain "
            f"timeout ({timeout_s:g} s, pddflow deploy --drain-timeout); it was aborted"
        )

    async def abort_all(self, message: str, answer_s: float = 5.0) -> int:
        """Abort every running request with a 503 saying `message`; wait up to answer_s for each
        to have told its client."""
        self.refusal = self.refusal or "the server is shutting down; it takes no new requests"
        left = list(self.completions)
        for completion in left:
            completion.abort(RequestRejected(503, message))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + answer_s
        while self.completions and loop.time() < deadline:
            await self._changes(deadline - loop.time())
        return len(left)

    async def _changes(self, timeout_s: float) -> None:
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout=max(timeout_s, 0.0))
        except TimeoutError:
            pass
