"""A worker's reports waiting for a report stream. A stream that ended must not take one more:
gRPC's sending thread for a call that has ended still asks its iterator for the next message,
and drops it (a lost token report: the request waits out its deadline). So each stream reads
through its own `stream()`, which stops once its call is over and hands back what it took too
late."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator

from pddflow.runtime.proto import runtime_pb2 as pb


class ReportQueue:
    def __init__(self) -> None:
        self._items: deque[pb.Report] = deque()
        self._ready = threading.Condition()

    def put(self, report: pb.Report) -> None:
        with self._ready:
            self._items.append(report)
            self._ready.notify()

    def get(self, timeout_s: float) -> pb.Report | None:
        with self._ready:
            if not self._items:
                self._ready.wait(timeout_s)
            return self._items.popleft() if self._items else None

    def unget(self, report: pb.Report) -> None:
        """Back at the head, for the next stream: order is kept."""
        with self._ready:
            self._items.appendleft(report)
            self._ready.notify()

    def stream(
        self, closed: threading.Event, poll_s: float
    ) -> tuple[Iterator[pb.Report], threading.Event]:
        """A stream's messages, and the event that ends them (set it when the call is over)."""
        ended = threading.Event()

        def messages() -> Iterator[pb.Report]:
            while not (closed.is_set() or ended.is_set()):
                report = self.get(poll_s)
                if report is None:
                    continue
                if ended.is_set():
                    self.unget(report)
                    return
                yield report

        return messages(), ended
