"""The deployer's watch over its workers: a worker process that dies is restarted (with backoff,
at most `max_restarts` in `window_s`) and the frontend hears of both, so it routes around the
instance until it reports ready again."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("pddflow.supervisor")


class Restartable(Protocol):
    def instances(self) -> list[str]: ...
    def alive(self, instance: str) -> bool: ...
    def exit_summary(self, instance: str) -> str: ...
    def restart(self, instance: str) -> None: ...


class Supervisor:
    def __init__(
        self,
        backend: Restartable,
        on_exit: Callable[[str, str], None],
        on_restart: Callable[[str, int], None],
        max_restarts: int = 5,
        window_s: float = 300.0,
        backoff_s: float = 1.0,
        poll_s: float = 0.2,
    ):
        self.backend, self.on_exit, self.on_restart = backend, on_exit, on_restart
        self.max_restarts, self.window_s, self.backoff_s, self.poll_s = (
            max_restarts,
            window_s,
            backoff_s,
            poll_s,
        )
        self.history: dict[str, list[float]] = {}  # instance -> its restart times
        self.due: dict[str, float] = {}  # dead instance -> when to restart it
        self.given_up: set[str] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # a check and live scaling's forget, one at a time
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def forget(self, inst: str) -> None:
        """`inst` was stopped on purpose (live scaling): no restart due, its count starts over."""
        with self._lock:
            self.due.pop(inst, None)
            self.history.pop(inst, None)
            self.given_up.discard(inst)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            for inst in self.backend.instances():
                try:
                    with self._lock:
                        self._check(inst)
                except Exception:  # noqa: BLE001 - one instance's trouble must not stop the watch
                    log.exception("supervising %s", inst)

    def _check(self, inst: str) -> None:
        if inst in self.given_up or self.backend.alive(inst):
            return
        now = time.monotonic()
        if inst not in self.due:
            summary = self.backend.exit_summary(inst)
            log.error("%s", summary)
            self.on_exit(inst, summary)
            recent = [t for t in self.history.get(inst, []) if t > now - self.window_s]
            self.history[inst] = recent
            if len(recent) >= self.max_restarts:
                self.given_up.add(inst)
                log.error(
                    "%s died %d times in %g s: not restarted again",
                    inst,
                    len(recent),
                    self.window_s,
                )
                return
            self.due[inst] = now + self.backoff_s * 2 ** len(recent)
        if now >= self.due[inst]:
            del self.due[inst]
            self.history[inst].append(now)
            self.backend.restart(inst)
            log.warning(
                "%s restarted (%d in the last %g s)", inst, len(self.history[inst]), self.window_s
            )
            self.on_restart(inst, len(self.history[inst]))
