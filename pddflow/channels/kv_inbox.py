"""The receive side's hand-off point: completed KV sets waiting for the worker, per sequence, with
cancellation. Shared by every KV receiver so `recv` and `cancel` mean the same on each channel."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from pddflow.channels.deadline import Deadline
from pddflow.channels.errors import ChannelCancelled, ChannelClosed
from pddflow.core.payloads import KVBlocks

CANCEL_MEMORY_S = 60.0  # how long a cancelled seq_id stays refused


class KVInbox:
    def __init__(self, name: str):
        self.name = name
        self._cond = threading.Condition()
        # (seq_id, heads): the shards of one sequence from several tensor-parallel ranks coexist
        self._done: OrderedDict[tuple[str, tuple[int, int] | None], KVBlocks] = OrderedDict()
        self._cancelled: dict[str, tuple[str, float]] = {}
        self._closed = False

    def put(self, kv: KVBlocks) -> bool:
        """False (and the set is dropped) when its sequence was cancelled meanwhile."""
        with self._cond:
            if self._closed or self._is_cancelled_locked(kv.seq_id):
                return False
            self._done[(kv.seq_id, kv.heads)] = kv
            self._cond.notify_all()
            return True

    def get(self, seq_id: str | None, dl: Deadline) -> KVBlocks:
        with self._cond:
            while True:
                if self._closed:
                    raise ChannelClosed(f"{self.name} receiver closed")
                if seq_id is None and self._done:
                    return self._done.popitem(last=False)[1]
                if seq_id is not None:
                    key = next((k for k in self._done if k[0] == seq_id), None)
                    if key is not None:
                        return self._done.pop(key)
                    reason = self.cancelled_reason(seq_id)
                    if reason is not None:
                        raise ChannelCancelled(f"{self.name}: {seq_id!r} was cancelled: {reason}")
                left = dl.remaining()
                if left <= 0:
                    raise dl.timeout("waiting for a KV set")
                self._cond.wait(min(left, 1.0))

    def cancel(self, seq_id: str, reason: str) -> None:
        with self._cond:
            self._cancelled[seq_id] = (reason, time.monotonic() + CANCEL_MEMORY_S)
            for key in [k for k in self._done if k[0] == seq_id]:
                del self._done[key]
            self._cond.notify_all()

    def cancelled_reason(self, seq_id: str) -> str | None:
        with self._cond:
            return self._cancelled[seq_id][0] if self._is_cancelled_locked(seq_id) else None

    def _is_cancelled_locked(self, seq_id: str) -> bool:
        entry = self._cancelled.get(seq_id)
        if entry is None:
            return False
        if entry[1] < time.monotonic():
            del self._cancelled[seq_id]
            return False
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._done.clear()
            self._cond.notify_all()
