"""What runs on a Ray node for one instance: the actor (`InstanceHost`) that starts and watches the
worker process there and keeps its log and TLS key, and the driver's record of it (`Hosted`)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pddflow.runtime.deploy.processes import WorkerProcess
from pddflow.runtime.wiring import free_port


class InstanceHost:
    """The Ray actor of one instance: runs `python -m pddflow.runtime.workers` on its node, keeps
    its log there, says whether it runs. Made a Ray actor class by RayBackend."""

    def __init__(self, deployment: str, instance: str):
        self.deployment, self.instance = deployment, instance
        self.dir = Path(tempfile.mkdtemp(prefix=f"pddflow-{deployment}-"))  # 0700
        self.worker: WorkerProcess | None = None
        self.tls_key = ""

    def where(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "actor_pid": os.getpid(),
            "log_dir": str(self.dir),
        }

    def ports(self, n: int, host: str) -> list[int]:
        return [free_port(host) for _ in range(n)]

    def tls_request(self) -> bytes:
        """A private key made on this node (it never leaves) and the signing request for it."""
        from pddflow.channels.security import key_and_request

        self.tls_key, csr = key_and_request(self.dir, self.instance)
        return csr

    def start(self, wiring_json: str, files: dict[str, bytes]) -> int:
        """(Re)start the worker; the wiring's TLS paths are this node's: its own key, the
        certificate the deployment signed for it (`cert`) and the deployment's CA (`roots`)."""
        d = json.loads(wiring_json)
        for name, data in files.items():
            path = self.dir / f"{name}.pem"
            path.unlink(missing_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            d[f"tls_{name}"] = str(path)
        if files:
            d["tls_key"] = self.tls_key
        wiring = self.dir / "wiring.json"
        wiring.unlink(missing_ok=True)
        fd = os.open(wiring, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(d, f)
        if self.worker is not None and self.worker.alive():
            self.worker.stop()
        name = self.instance.replace("/", "-")
        self.worker = WorkerProcess(
            self.instance,
            [sys.executable, "-m", "pddflow.runtime.workers", str(wiring), self.instance],
            self.dir / f"{name}.log",
        )
        self.worker.start()
        return self.worker.pid or 0

    def poll(self) -> tuple[bool, str, int]:
        """(the worker runs, why it ended if it did, its pid)"""
        w = self.worker
        if w is None:
            return False, f"{self.instance} was never started", 0
        if w.alive():
            return True, "", w.pid or 0
        return False, f"{w.exit_summary()} (on {socket.gethostname()})", w.pid or 0

    def stop(self, grace_s: float = 5.0) -> None:
        if self.worker is not None:
            self.worker.stop(grace_s)
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Hosted:
    """The driver's view of one instance."""

    instance: str
    group: int
    bundle: int
    actor: Any = None
    where: dict[str, Any] = field(default_factory=dict)
    alive: bool = False
    summary: str = ""
    pid: int = 0
    last_answer: float = 0.0
    pending: Any = None  # the poll in flight
    generation: int = 0  # restarts so far: a poll sent before the last one is not believed
    restarting: bool = False
