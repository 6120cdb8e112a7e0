"""Work from gRPC threads for an asyncio loop, applied in arrival order and in batches: what
arrives while the loop has not yet run the last batch joins it (one wakeup for many reports)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger("pddflow.frontend")


class LoopBatches:
    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._pending: deque[Callable[[], None]] = deque()
        self._drain_due = False

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self.loop = loop

    def running(self) -> asyncio.AbstractEventLoop | None:
        with self._lock:
            return self.loop

    def dispatch(self, fn: Callable[[], None]) -> None:
        """fn() on the loop, after what was dispatched before it."""
        with self._lock:  # before the server's loop exists (startup), it runs here
            if self.loop is None:
                fn()
                return
            self._pending.append(fn)
            if self._drain_due:
                return
            self._drain_due, loop = True, self.loop
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop has closed: shutting down
            pass

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._drain_due = False
                    return
                batch = list(self._pending)
                self._pending.clear()
            for fn in batch:
                try:
                    fn()
                except Exception:  # one bad report must not stall the ones behind it
                    log.exception("applying a report failed")
