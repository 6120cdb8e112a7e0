"""Stopping a deployment's API (docs/runtime.md, Stopping): the first SIGINT or SIGTERM drains it,
a second stops it at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import FrameType

import uvicorn

from pddflow.runtime.api.admission import Admission


class DrainingServer(uvicorn.Server):
    """uvicorn, except that a signal does not close the listening socket at once: new requests get
    503 while the running ones have up to `drain_timeout_s` to finish; whatever is left is then
    aborted (its client gets a 503 saying so) and the server stops. A second signal aborts what
    is left and stops at once."""

    def __init__(
        self,
        config: uvicorn.Config,
        admission: Admission,
        drain_timeout_s: float,
        say: Callable[[str], None] = print,
        also_stop: Callable[[bool], None] | None = None,
    ):
        """`also_stop(now)`, on a thread, while this server drains (now False) or stops at once:
        what else serves the deployment's API (deploy --api-servers: the other processes)."""
        super().__init__(config)
        self.admission, self.drain_timeout_s, self.say = admission, drain_timeout_s, say
        self.also_stop = also_stop
        self.signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:  # noqa: ANN001 - uvicorn's signature
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def shutdown(self, sockets=None) -> None:  # noqa: ANN001 - uvicorn's signature
        await super().shutdown(sockets)
        if self.force_exit:
            # uvicorn skips the app's shutdown then, and its lifespan task, cancelled at exit,
            # logs a traceback; the app's shutdown has nothing to wait for
            await self.lifespan.shutdown()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # a signal handler: it runs on the loop's thread between two steps; hand over to the loop
        self.signals += 1
        if self._loop is None or not self.started:  # still starting: nothing to drain
            self.should_exit = True
            self.force_exit = self.signals > 1
            return
        stop = self._drain if self.signals == 1 else self._stop_now
        try:
            self._loop.call_soon_threadsafe(self._start, stop)
        except RuntimeError:  # the loop has closed: uvicorn is done already
            self.should_exit = self.force_exit = True

    def _start(self, stop: Callable[[], object]) -> None:
        self._stopping = asyncio.ensure_future(stop())  # held: the loop keeps weak references

    async def _drain(self) -> None:
        n = len(self.admission.completions)
        self.say(
            f"stopping: new requests get 503; waiting up to {self.drain_timeout_s:g} s for "
            f"{n} running request{'s' if n != 1 else ''} (Ctrl-C again: stop now)"
        )
        drained = self.admission.drain(self.drain_timeout_s)
        if self.also_stop is not None:
            aborted, _ = await asyncio.gather(drained, asyncio.to_thread(self.also_stop, False))
        else:
            aborted = await drained
        if aborted:
            self.say(f"aborted {aborted} request{'s' if aborted != 1 else ''} still running")
        self.should_exit = True

    async def _stop_now(self) -> None:
        aborted = await self.admission.abort_all(
            "the server was stopped at once (a second interrupt); this request was aborted",
            answer_s=1.0,
        )
        if self.also_stop is not None:
            await asyncio.to_thread(self.also_stop, True)
        self.say(f"stopping now; aborted {aborted} request{'s' if aborted != 1 else ''}")
        self.force_exit = self.should_exit = True
