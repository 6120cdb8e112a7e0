"""The whole outputs of the legs that ended here in the last RETELL_S, by where their tokens went:
told again when that report stream breaks and reopens (`WorkerLoop.retell`), since the broken
stream may have taken a leg's last reports with it."""

from __future__ import annotations

import time
from collections import deque

from pddflow.runtime.proto import runtime_pb2 as pb

RETELL_S = 30.0  # a stream that breaks is reopened within seconds (rpc.py's reconnect backoff)


class EndedRuns:
    def __init__(self, keep_s: float = RETELL_S):
        self.keep_s = keep_s
        self._runs: deque[tuple[float, str, pb.Tokens]] = deque()

    def add(self, to: str, run: pb.Tokens) -> None:
        now = time.monotonic()
        self._runs.append((now, to, run))
        while self._runs and self._runs[0][0] < now - self.keep_s:
            self._runs.popleft()

    def retold(self, streams: set[str]) -> list[tuple[str, pb.Tokens]]:
        return [(to, run) for _, to, run in self._runs if to in streams]
