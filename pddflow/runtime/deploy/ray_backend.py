"""The `ray` backend of `pddflow deploy`: every instance of the plan is a worker process that a Ray
actor starts and supervises, on a node of its graph cluster (docs/deploy-ray.md).

The deploying process is the Ray driver; it keeps the frontend, the OpenAI API and /metrics. The
actors are owned by it (not detached): if the driver dies, Ray removes them, and a worker process
dies with its actor (PR_SET_PDEATHSIG). KV and token IDs travel over pddflow's own channels
between the nodes' addresses, never through Ray's object store; Ray only places, starts and
watches.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pddflow.channels.rdma_tensor.nixl_region import NixlBackend
from pddflow.core.ports import free_port
from pddflow.graph.plan import Plan
from pddflow.operators.engine_config import rank_device
from pddflow.runtime.deploy.backend import DeployError
from pddflow.runtime.deploy.ray_host import Hosted, InstanceHost
from pddflow.runtime.deploy.ray_placement import (
    Group,
    Node,
    diagnostics,
    groups,
    problems,
)
from pddflow.runtime.deploy.run_dir import WIRING_FILE, private_file
from pddflow.runtime.transports import routes, transports
from pddflow.runtime.wiring import Wiring, place_rdma_receivers

log = logging.getLogger("pddflow.ray")

POLL_S = 0.5  # how often the driver asks every actor whether its worker runs
CALL_TIMEOUT_S = 30.0  # one call to an actor (start, stop, ports)
UNANSWERED_S = 10.0  # an actor that answers no poll for this long counts as lost (node gone)
PLACEMENT_TIMEOUT_S = 60.0


def _ray():
    try:
        import ray
    except ImportError:
        raise DeployError(
            "the ray backend needs Ray: pip install 'pddflow[ray]' (or pip install ray)"
        ) from None
    return ray


class RayBackend:
    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        namespace: str = "pddflow",
        bind_all: bool = False,
        accelerators: dict[str, str] | None = None,
    ):
        self.address = address or os.environ.get("RAY_ADDRESS") or "auto"
        self.namespace = namespace
        self.bind_all = bind_all
        self.accelerators = dict(accelerators or {})
        self.hosts: dict[str, Hosted] = {}
        # the instances whose workers run; the others are parked for live scaling: placed, their
        # actor and addresses made (every worker learns every address at start), no process
        self.running: set[str] = set()
        self.ranks: dict[str, int] = {}  # instance -> its rank processes
        self.transports: dict[str, str] = {}
        self.endpoints: dict[str, dict[str, str]] = {}  # instance -> its published addresses
        self.pgs: list[Any] = []
        self.groups: list[Group] = []
        self.wiring_json = ""
        self.files: dict[str, dict[str, bytes]] = {}  # instance -> its TLS files
        self.ca: Any = None  # the deployment's CertificateAuthority, when its channels use TLS
        self.deployment = ""
        self.driver_ip = "127.0.0.1"
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- start -------------------------------------------------------------------------------

    def connect(self) -> None:
        ray = _ray()
        if not ray.is_initialized():
            try:
                ray.init(
                    address=self.address,
                    namespace=self.namespace,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise DeployError(
                    f"cannot reach the Ray cluster at {self.address}: {exc}"
                ) from None
        self.driver_ip = ray.util.get_node_ip_address()

    def nodes(self) -> list[Node]:
        ray = _ray()
        return [
            Node(n["NodeID"], n["NodeManagerAddress"], dict(n.get("Resources", {})))
            for n in ray.nodes()
            if n.get("Alive")
        ]

    def check_placement(self, plan: Plan) -> list[Group]:
        """The placement groups to make, or DeployError with `FILE:LINE:COL` diagnostics."""
        nodes = self.nodes()
        found = problems(plan, nodes, self.accelerators)
        if found:
            lines = "\n".join(str(d) for d in diagnostics(plan, found))
            raise DeployError(f"the Ray cluster cannot hold {plan.name}:\n{lines}")
        return groups(plan, nodes, self.accelerators)

    def start(self, plan: Plan, wiring: Wiring, run_dir: Path) -> None:
        ray = _ray()
        from ray.util.placement_group import placement_group

        self.connect()
        self.groups = self.check_placement(plan)  # before anything starts
        self.ranks = {i.id: plan.operator_of(i.id).ranks for i in plan.instances}
        self.deployment = wiring.deployment
        for gi, g in enumerate(self.groups):
            pg = placement_group(
                g.bundles, strategy="STRICT_PACK", name=f"{self.deployment}:{g.instances[0]}"
            )
            self.pgs.append(pg)
            for bi, inst in enumerate(g.instances):
                self.hosts[inst] = Hosted(inst, gi, bi)
        ready = [pg.ready() for pg in self.pgs]
        done, _ = ray.wait(ready, num_returns=len(ready), timeout=PLACEMENT_TIMEOUT_S)
        if len(done) < len(ready):
            waiting = [
                f"{', '.join(g.instances)} ({g.need()})"
                for g, r in zip(self.groups, ready)
                if r not in done
            ]
            raise DeployError(
                f"Ray did not place {'; '.join(waiting)} within {PLACEMENT_TIMEOUT_S:g} s: the "
                "resources exist but others hold them (see `ray status`)"
            )
        for h in self.hosts.values():
            self._make_actor(h)
        wheres = ray.get([h.actor.where.remote() for h in self.hosts.values()], timeout=60)
        for h, w in zip(self.hosts.values(), wheres):
            h.where = w
        self._wire(plan, wiring, run_dir)
        # the deployer's copy, as the local backend's (0600: it holds the token)
        private_file(run_dir / WIRING_FILE)
        wiring.save(run_dir / WIRING_FILE)
        first = [self.hosts[i] for i in plan.initial_instances()]
        pids = ray.get(
            [h.actor.start.remote(self.wiring_json, self.files.get(h.instance, {})) for h in first],
            timeout=CALL_TIMEOUT_S,
        )
        now = time.monotonic()
        for h, ranks in zip(first, pids):
            h.alive, h.pid, h.ranks, h.last_answer = True, ranks[0], ranks, now
            self.running.add(h.instance)
        self._watch = threading.Thread(target=self._watch_loop, name="ray-watch", daemon=True)
        self._watch.start()

    def _make_actor(self, h: Hosted) -> None:
        ray = _ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.groups[h.group].bundles[h.bundle]
        custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
        h.actor = (
            ray.remote(InstanceHost)
            .options(
                name=f"{self.deployment}:{h.instance}",
                num_cpus=bundle.get("CPU", 0),
                num_gpus=bundle.get("GPU", 0),
                resources=custom,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pgs[h.group], placement_group_bundle_index=h.bundle
                ),
            )
            .remote(self.deployment, h.instance, self.ranks[h.instance])
        )

    def _wire(self, plan: Plan, wiring: Wiring, run_dir: Path) -> None:
        """Every endpoint at its node's address, on ports free there; the frontend at this
        process's node address; no CPU pinning (the nodes are not this host)."""
        ray = _ray()
        # a host is a node IP (Ray's NodeManagerAddress): rdma_tensor pairs on one share memory
        node_ip = {n.node_id: n.ip for n in self.nodes()}
        host_of = {i: node_ip.get(h.where["node_id"], h.where["ip"]) for i, h in self.hosts.items()}
        bind = "0.0.0.0" if self.bind_all else None
        try:
            wiring.rdma = routes(plan, host_of, nixl=NixlBackend.available())
        except ValueError as exc:
            raise DeployError(str(exc)) from None
        need = {}
        for inst, ep in wiring.workers.items():
            # a network receiver's address waits for a port free on its node (below)
            place_rdma_receivers(wiring, inst, ep, lambda: "tcp:pending", self.ranks[inst])
            ep.tp_init = "pending" if self.ranks[inst] > 1 else ""  # a port on its node, below
            need[inst] = 1 + bool(ep.kv_flight) + bool(ep.handoff) + bool(ep.kv_rdma_net)
            need[inst] += bool(ep.tp_init) + len(ep.kv_rdma_ranks)
        got = ray.get(
            [self.hosts[i].actor.ports.remote(n, bind or host_of[i]) for i, n in need.items()],
            timeout=CALL_TIMEOUT_S,
        )
        for (inst, ep), ports in zip(wiring.workers.items(), got):
            ip = host_of[inst]
            ep.rpc = f"{ip}:{ports.pop(0)}"
            if ep.kv_flight:
                ep.kv_flight = f"grpc://{ip}:{ports.pop(0)}"
            if ep.handoff:
                ep.handoff = f"{ip}:{ports.pop(0)}"
            if ep.kv_rdma_net:
                ep.kv_rdma_net = f"tcp:{ip}:{ports.pop(0)}"
            if ep.tp_init:  # the ranks share the actor's node: its own address
                ep.tp_init = f"{ip}:{ports.pop(0)}"
            ep.kv_rdma_ranks = [f"tcp:{ip}:{ports.pop(0)}" for _ in ep.kv_rdma_ranks]
            self.endpoints[inst] = {k: v for k, v in asdict(ep).items() if v}
        wiring.frontend = f"{self.driver_ip}:{free_port(bind or self.driver_ip)}"
        # the API processes (deploy --api-servers) run beside the frontend, on this node
        for name in wiring.api_servers:
            wiring.api_servers[name] = f"{self.driver_ip}:{free_port(bind or self.driver_ip)}"
        wiring.bind_all = self.bind_all
        wiring.cpus, wiring.nice, wiring.via, wiring.links = {}, {}, {}, {}
        self.transports = wiring.transports = transports(plan, host_of, wiring.rdma)
        if wiring.tls_cert:
            self._certify(wiring, run_dir)
        self.wiring_json = json.dumps(asdict(wiring))

    def _certify(self, wiring: Wiring, run_dir: Path) -> None:
        """Mutual TLS without moving a private key: the deployment's CA (its key stays here)
        signs every instance's request for its own node's address, and this process's for the
        frontend; every end trusts the CA."""
        from pddflow.channels.security import CertificateAuthority, key_and_request

        tls = run_dir / "tls"
        self.ca = CertificateAuthority.create(tls)
        key, csr = key_and_request(tls, "frontend")
        cert = tls / "cert.pem"
        cert.write_bytes(self.ca.sign(csr, _names(self.driver_ip)))
        wiring.tls_cert, wiring.tls_key, wiring.tls_roots = str(cert), key, self.ca.cert
        self._certify_hosts(list(self.hosts.values()))

    def _certify_hosts(self, hosts: list[Hosted]) -> None:
        """Each actor makes its key and request at once (in parallel); each is signed here."""
        ray = _ray()
        csrs = ray.get([h.actor.tls_request.remote() for h in hosts], timeout=CALL_TIMEOUT_S)
        roots = Path(self.ca.cert).read_bytes()
        for h, csr in zip(hosts, csrs):
            self.files[h.instance] = {
                "cert": self.ca.sign(csr, _names(h.where["ip"])),
                "roots": roots,
            }

    # -- watch -------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        ray = _ray()
        while not self._stop.wait(POLL_S):
            for h in list(self.hosts.values()):
                try:
                    self._poll(ray, h)
                except Exception:  # noqa: BLE001 - one instance's trouble must not stop the watch
                    log.exception("watching %s", h.instance)

    def _poll(self, ray: Any, h: Hosted) -> None:
        with self._lock:
            if h.actor is None or h.restarting or h.instance not in self.running:
                return
            if h.pending is None:
                h.pending = (h.actor.poll.remote(), h.generation)
            ref, generation = h.pending
        done, _ = ray.wait([ref], timeout=0.05)
        now = time.monotonic()
        if not done:
            if h.alive and now - h.last_answer > UNANSWERED_S:
                h.alive = False
                h.summary = (
                    f"{h.instance}: its Ray actor on node {h.where.get('node_id', '?')[:12]} "
                    f"({h.where.get('ip', '?')}) answered nothing for {UNANSWERED_S:g} s"
                )
            return
        try:
            alive, summary, pid = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            alive, pid = None, 0
            summary = f"{h.instance}: its Ray actor died ({type(exc).__name__}: {exc})"[:2000]
        with self._lock:
            if h.pending is not None and h.pending[0] is ref:
                h.pending = None
            if h.restarting or generation != h.generation:
                return  # sent before a restart: about what ran then
            if alive is None:  # the actor is gone (its process, or its node)
                h.actor = None
            h.last_answer = now
            h.alive, h.pid = bool(alive), pid
            if not alive:
                h.summary = summary

    # -- the Backend / Restartable protocol --------------------------------------------------

    def check(self) -> str | None:
        for i in list(self.running):  # a pool change may alter it meanwhile (another thread)
            h = self.hosts[i]
            if not h.alive:
                return h.summary or f"{h.instance} is not running"
        return None

    def instances(self) -> list[str]:
        return [i for i in self.hosts if i in self.running]

    # -- live scaling: a parked instance's worker starts in its placed actor, or stops there ----

    def start_instance(self, instance: str) -> None:
        """Its worker in its kept actor (a new actor in the same bundle if that one was lost)."""
        h = self.hosts[instance]
        self._restart(h, h.actor)
        with self._lock:
            h.generation += 1
            h.pending, h.summary = None, ""
            self.running.add(instance)

    def stop_instance(self, instance: str) -> None:
        """Stop its worker; the actor keeps its placement, addresses and TLS key for a start."""
        ray = _ray()
        h = self.hosts[instance]
        with self._lock:
            self.running.discard(instance)
            h.generation += 1
            h.pending, h.alive, h.pid, h.ranks = None, False, 0, []
        if h.actor is not None:
            try:
                ray.get(h.actor.halt.remote(), timeout=CALL_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - a lost actor has no worker left to stop
                log.warning("%s: its actor did not answer the stop", instance)

    def alive(self, instance: str) -> bool:
        return self.hosts[instance].alive

    def exit_summary(self, instance: str) -> str:
        return self.hosts[instance].summary or f"{instance} is not running"

    def restart(self, instance: str) -> None:
        """The worker again, with the same wiring: in its actor when the actor lives, else in a
        new actor in the same placement-group bundle, which must be on the same address."""
        h = self.hosts[instance]
        with self._lock:
            h.restarting, h.pending = True, None
            actor = h.actor
        try:
            self._restart(h, actor)
        finally:
            with self._lock:
                h.generation += 1
                h.pending, h.restarting = None, False

    def _restart(self, h: Hosted, actor: Any) -> None:
        ray = _ray()
        instance = h.instance
        if actor is None:
            self._make_actor(h)
            try:
                where = ray.get(h.actor.where.remote(), timeout=CALL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - reported, the supervisor counts it
                raise DeployError(f"{instance}: no new Ray actor: {exc}") from None
            if where["ip"] != h.where["ip"]:
                self._kill(h)
                raise DeployError(
                    f"{instance}: its placement moved from {h.where['ip']} to {where['ip']}; "
                    "moving an instance to another address is not supported"
                )
            h.where = where
            if self.ca is not None:
                self._certify_hosts([h])  # a new actor made a new key
        h.ranks = ray.get(
            h.actor.start.remote(self.wiring_json, self.files.get(instance, {})),
            timeout=CALL_TIMEOUT_S,
        )
        h.pid = h.ranks[0]
        h.alive, h.last_answer = True, time.monotonic()

    def _kill(self, h: Hosted) -> None:
        ray = _ray()
        with self._lock:
            actor, h.actor = h.actor, None
        if actor is not None:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def cutter(self) -> None:
        return None  # the nodes' connections are real: nothing here stands in their way

    def impairer(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        """For /health: the backend, where each instance runs, how each channel is carried."""
        return {"backend": self.name, "workers": self.placement(), "channels": self.transports}

    def placement(self) -> dict[str, dict[str, Any]]:
        return {
            i: {
                "backend": "ray",
                "node": h.where.get("node_id", ""),
                "node_ip": h.where.get("ip", ""),
                "address": self.endpoints.get(i, {}).get("rpc", ""),
                "endpoints": self.endpoints.get(i, {}),
                "hostname": h.where.get("hostname", ""),
                "actor": f"{self.namespace}/{self.deployment}:{i}",
                "actor_pid": h.where.get("actor_pid", 0),
                "pid": h.pid,
                "ranks": [
                    {
                        "rank": r,
                        "pid": pid,
                        "device": rank_device(r, gpus=h.where.get("gpus", 0)),
                        "node": h.where.get("ip", ""),
                    }
                    for r, pid in enumerate(h.ranks)
                ],
            }
            for i, h in self.hosts.items()
        }

    def pids(self) -> dict[str, int]:
        return {i: h.pid for i, h in self.hosts.items() if h.pid}

    def stop(self) -> None:
        """Every actor and placement group this deployment made, and nothing else."""
        self._stop.set()
        if self._watch is not None:
            self._watch.join(timeout=5)
        try:
            ray = _ray()
        except DeployError:
            return
        if not ray.is_initialized():
            return
        actors = [h.actor for h in self.hosts.values() if h.actor is not None]
        refs = [a.stop.remote() for a in actors]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=10)
        for h in self.hosts.values():
            self._kill(h)
        from ray.util.placement_group import remove_placement_group

        for pg in self.pgs:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - best effort; the driver's exit frees the rest
                log.warning("placement group %s not removed", pg.id)
        self.pgs = []
        ray.shutdown()


def _names(ip: str) -> tuple[str, ...]:
    """What a certificate is valid for: the node's address, and loopback for its own clients."""
    return tuple(dict.fromkeys((ip, "127.0.0.1", "localhost")))
