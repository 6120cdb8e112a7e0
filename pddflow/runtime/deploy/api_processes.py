"""The API processes of `deploy --api-servers N`: started by the deployer on its listening socket
(each inherits it), stopped before the router (they drain first: their requests' ends reach the
router), and dying with the deployer."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

from pddflow.core.child_python import python_module
from pddflow.runtime.deploy.processes import WorkerProcess
from pddflow.runtime.wiring import Wiring


def api_names(n: int) -> list[str]:
    return [f"api-{i}" for i in range(n)]


class ApiProcesses:
    def __init__(self, procs: list[WorkerProcess], wiring: Wiring):
        self.procs, self.wiring = procs, wiring

    @staticmethod
    def start(
        wiring: Wiring,
        wiring_file: Path,
        listening: socket.socket,
        router_http: str,
        run_dir: Path,
        *,
        stream_interval: int,
        drain_timeout_s: float,
        log_level: str,
        modeled: bool,
        chat_template: Path | None,
        keys: dict[str, str],
    ) -> ApiProcesses:
        fd = listening.fileno()
        procs = []
        for name in wiring.api_servers:
            argv = [*python_module("pddflow.runtime.api.api_process"), str(wiring_file)]
            argv += [name, "--fd", str(fd), "--router-http", router_http]
            argv += ["--stream-interval", str(stream_interval)]
            argv += ["--drain-timeout", str(drain_timeout_s), "--log-level", log_level]
            argv += ["--modeled"] if modeled else []
            argv += ["--chat-template", str(chat_template)] if chat_template else []
            p = WorkerProcess(name, argv, run_dir / f"{name}.log", env=keys, pass_fds=(fd,))
            p.start()
            procs.append(p)
        return ApiProcesses(procs, wiring)

    def wait_ready(self, timeout_s: float) -> str | None:
        """None once every process's token service answers; else why not."""
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            host, port = self.wiring.api_servers[p.name].rsplit(":", 1)
            while True:
                if not p.alive():
                    return p.exit_summary()
                try:
                    socket.create_connection((host, int(port)), timeout=0.5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        return f"{p.name} did not start within {timeout_s:g} s"
                    time.sleep(0.1)
        return None

    def describe(self) -> list[dict]:
        return [{"name": p.name, "pid": p.pid, "alive": p.alive()} for p in self.procs]

    def stop(self, now: bool = False, grace_s: float = 40.0) -> None:
        """Drain them (SIGTERM: new requests 503, running ones finish), or, `now`, stop them at
        once (their second signal); SIGKILL after `grace_s`."""
        for p in self.procs:
            p.signal(signal.SIGTERM)
            if now:
                time.sleep(0.05)
                p.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            if p.proc is None:
                continue
            try:
                p.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - past the grace
                p.signal(signal.SIGKILL)
                p.proc.wait(timeout=5)
            if not p.log.closed:
                p.log.close()
