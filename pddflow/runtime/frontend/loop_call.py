"""A call from another thread onto the frontend's event loop, waited for, that notices the loop
stopping (the server ended) at once instead of waiting out its timeout."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from typing import Any


class LoopStopped(RuntimeError):
    """A call for the frontend's loop found it stopped: the server has ended."""


def call_on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any], timeout_s: float) -> Any:
    """fn() run on `loop`, its result (TimeoutError after `timeout_s`; LoopStopped as soon as
    the loop is no longer running)."""

    async def call() -> Any:
        return fn()

    done = asyncio.run_coroutine_threadsafe(call(), loop)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return done.result(timeout=0.1)
        except concurrent.futures.TimeoutError:
            if not loop.is_running():
                done.cancel()
                raise LoopStopped("the frontend's loop has stopped") from None
            if time.monotonic() > deadline:
                raise
