"""Worker processes of the local backend: start, watch, stop (SIGTERM, then SIGKILL), and die with
the deployer (core/parent_death.py: the worker sets its death signal itself, first thing, since
the deployer has gRPC threads once it serves and live scaling and restarts start workers then),
so nothing is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from threading import Thread

from pddflow.core.parent_death import parent_env


@dataclass
class WorkerProcess:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    tail: deque = field(default_factory=lambda: deque(maxlen=40))
    pass_fds: tuple[int, ...] = ()  # an API process's: the deployment's listening socket

    def start(self) -> None:
        env = parent_env({**os.environ, **self.env, "PYTHONUNBUFFERED": "1"})
        if getattr(self, "log", None) is not None and not self.log.closed:
            self.log.close()  # a restart: the dead process's output has ended
        # appended: a restarted worker's log follows its predecessor's
        self.log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            # its own process group: Ctrl-C in the terminal goes to the deployer, which stops
            # workers in order
            process_group=0,
            pass_fds=self.pass_fds,
        )
        Thread(target=self._pump, name=f"log-{self.name}", daemon=True).start()

    def _pump(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            self.tail.append(line.decode(errors="replace").rstrip())

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_summary(self) -> str:
        code = self.proc.returncode if self.proc else None
        last = "\n    ".join(list(self.tail)[-8:]) or "(no output)"
        return f"{self.name} exited with status {code}; last output ({self.log_path}):\n    {last}"

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float = 5.0) -> None:
        if self.proc is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(timeout=5)
        self.log.close()


def stop_all(workers: list[WorkerProcess], grace_s: float = 5.0) -> None:
    """SIGTERM everyone at once, then wait for each with one shared deadline."""
    for w in workers:
        w.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for w in workers:
        if w.proc is None:
            continue
        try:
            w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.signal(signal.SIGKILL)
            w.proc.wait(timeout=5)
        if not w.log.closed:
            w.log.close()
