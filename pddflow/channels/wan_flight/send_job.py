"""The sender's bookkeeping of one resumable wan_flight transfer: which runs of blocks still have
to go, which the receiver has acknowledged, and how often each was rejected."""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from pddflow.channels.codec_kv import KVSource
from pddflow.channels.deadline import Deadline
from pddflow.channels.errors import ChannelCorrupt


class SendJob:
    """One send: a shared queue of block runs that every stream pulls from (so a slow stream
    simply takes fewer runs), and which blocks the receiver has acknowledged."""

    def __init__(self, src: KVSource, transfer_id: str, deadline: Deadline, max_batch_bytes: int):
        self.src, self.transfer_id, self.deadline = src, transfer_id, deadline
        n = src.kv.num_blocks
        per_run = max(1, max_batch_bytes // max(1, src.layout.block_bytes))
        self._queue: deque[tuple[int, int]] = deque(
            (lo, min(n, lo + per_run)) for lo in range(0, n, per_run)
        )
        self._acked = np.zeros(n, dtype=bool)
        self._count = 0
        self._rejections: dict[int, int] = {}
        self.cond = threading.Condition()
        self.abort = threading.Event()
        self.resent = 0
        self.reconnects = 0

    @property
    def complete(self) -> bool:
        with self.cond:
            return self._count == self.src.kv.num_blocks

    def take(self) -> tuple[int, int] | None:
        """The next run with blocks not yet acknowledged, trimmed to its first missing sub-run."""
        with self.cond:
            while self._queue:
                lo, hi = self._queue.popleft()
                missing = np.flatnonzero(~self._acked[lo:hi])
                if missing.size == 0:
                    continue
                start = lo + int(missing[0])
                end = start
                while end < hi and not self._acked[end]:
                    end += 1
                if end < hi:
                    self._queue.appendleft((end, hi))
                return start, end
            return None

    def give_back(self, runs: list[tuple[int, int]]) -> None:
        with self.cond:
            self._queue.extendleft(reversed(runs))
            self.cond.notify_all()

    def acked(self, blocks: list[int] | np.ndarray) -> None:
        with self.cond:
            for b in blocks:
                if not self._acked[b]:
                    self._acked[b] = True
                    self._count += 1
            self.cond.notify_all()

    def rejected(self, blocks: list[int], max_retries: int) -> None:
        with self.cond:
            for b in blocks:
                self._rejections[b] = self._rejections.get(b, 0) + 1
                if self._rejections[b] > max_retries:
                    raise ChannelCorrupt(
                        f"{self.deadline.what}: block {b} failed its {self.src.checksum} checksum "
                        f"at the receiver {self._rejections[b]} times",
                        [b],
                    )
            self.resent += len(blocks)
            self._queue.extend((b, b + 1) for b in blocks)
            self.cond.notify_all()

    def wait_for_work(self) -> None:
        """Idle stream: wait until there is work again or the set is complete (others' acks)."""
        with self.cond:
            if not self._queue and self._count < self.src.kv.num_blocks and not self.abort.is_set():
                self.cond.wait(min(0.05, self.deadline.remaining()))
