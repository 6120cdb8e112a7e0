"""What runs on a Ray node for one instance: the actor (`InstanceHost`) that starts and watches the
worker process there and keeps its log and TLS key, and the driver's record of it (`Hosted`)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pddflow.core.child_python import python_module
from pddflow.core.ports import free_port
from pddflow.graph.plan import rank_name
from pddflow.runtime.deploy.processes import WorkerProcess


class InstanceHost:
    """The Ray actor of one instance: runs its rank processes (`python -m pddflow.runtime.workers`,
    one per rank, on the devices Ray gave the actor) on its node, keeps their logs there, says
    whether they all run. Made a Ray actor class by RayBackend."""

    def __init__(self, deployment: str, instance: str, ranks: int = 1):
        self.deployment, self.instance, self.ranks = deployment, instance, ranks
        self.dir = Path(tempfile.mkdtemp(prefix=f"pddflow-{deployment}-"))  # 0700
        self.workers: list[WorkerProcess] = []  # the leader (rank 0) first
        self.tls_key = ""

    def where(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "actor_pid": os.getpid(),
            "gpus": len(ray.get_gpu_ids()),  # its ranks take them in rank order
            "log_dir": str(self.dir),
        }

    def ports(self, n: int, host: str) -> list[int]:
        return [free_port(host) for _ in range(n)]

    def tls_request(self) -> bytes:
        """A private key made on this node (it never leaves) and the signing request for it."""
        from pddflow.channels.security import key_and_request

        self.tls_key, csr = key_and_request(self.dir, self.instance)
        return csr

    def start(self, wiring_json: str, files: dict[str, bytes]) -> list[int]:
        """(Re)start every rank (together: a tensor-parallel group takes no new member); the
        wiring's TLS paths are this node's: its own key, the certificate the deployment signed for
        it (`cert`) and the deployment's CA (`roots`). Every rank's pid, the leader first."""
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
        for w in self.workers:
            if w.alive():
                w.stop()
        argv = [*python_module("pddflow.runtime.workers"), str(wiring), self.instance]
        self.workers = []
        for rank in range(self.ranks):
            name = rank_name(self.instance, rank)
            log = self.dir / f"{name.replace('/', '-')}.log"
            w = WorkerProcess(name, argv + ([str(rank)] if rank else []), log)
            w.start()
            self.workers.append(w)
        return [w.pid or 0 for w in self.workers]

    def poll(self) -> tuple[bool, str, int]:
        """(every rank runs, why the first one that ended did, the leader's pid)"""
        if not self.workers:
            return False, f"{self.instance} was never started", 0
        pid = self.workers[0].pid or 0
        dead = next((w for w in self.workers if not w.alive()), None)
        if dead is None:
            return True, "", pid
        return False, f"{dead.exit_summary()} (on {socket.gethostname()})", pid

    def halt(self, grace_s: float = 5.0) -> None:
        """Stop the ranks (live scaling parked the instance); its files stay for a new start."""
        for w in self.workers:
            w.stop(grace_s)
        self.workers = []

    def stop(self, grace_s: float = 5.0) -> None:
        self.halt(grace_s)
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
    pid: int = 0  # the leader's
    ranks: list[int] = field(default_factory=list)  # every rank's pid, the leader first
    last_answer: float = 0.0
    pending: Any = None  # the poll in flight
    generation: int = 0  # restarts so far: a poll sent before the last one is not believed
    restarting: bool = False
