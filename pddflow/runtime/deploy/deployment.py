"""A deployment of a plan (docs/runtime.md): it owns the backend that runs the instances, their
wiring, the frontend, the supervisor, the API server and the run directory. `pddflow deploy` is a
thin shell over it; a test or a benchmark drives the same object:

    d = Deployment(plan, DeployOptions(port=0))
    d.start()       # the API's port taken, every instance ready; or DeployError
    d.serve()       # the OpenAI API until a signal (or stop() from another thread), then drained
    d.stop()        # every instance stopped, the run directory cleaned
"""

from __future__ import annotations

import atexit
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pddflow.core.device import LOCAL_KV_CACHE_MIB
from pddflow.core.ports import free_port
from pddflow.graph.plan import Plan
from pddflow.runtime.deploy.api_processes import ApiProcesses, api_names
from pddflow.runtime.deploy.backend import Backend, DeployError, Progress, wait_ready
from pddflow.runtime.deploy.modeled import DEFAULT_KV_SCALE, check_engine_profile, modeled_plan
from pddflow.runtime.deploy.run_dir import (
    make_run_dir,
    private_file,
    remove_disk_tiers,
    remove_run_dir,
)
from pddflow.runtime.deploy.supervisor import Supervisor
from pddflow.runtime.frontend.frontend import Frontend
from pddflow.runtime.frontend.link_admin import LinkAdmin
from pddflow.runtime.frontend.model_info import ModelInfo, model_info
from pddflow.runtime.transports import secure_cross_cluster
from pddflow.runtime.wiring import Wiring, wire

BACKENDS = ("local", "ray")
log = logging.getLogger("pddflow.deploy")


class OptionError(DeployError):
    """An option that cannot work as given (the CLI's usage error); nothing has started."""


class ScaleError(Exception):
    """A pool change that cannot be made; `status` is the admin API's answer."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, kw_only=True)
class DeployOptions:
    """What `pddflow deploy`'s options set; each default is the option's (docs/cli.md)."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (`Deployment.port` says which)
    backend: str | None = None  # None: the graph's deploy.backend
    address: str | None = None  # ray: the cluster's (None: the graph's, RAY_ADDRESS, 'auto')
    kv_cache_mb: int = LOCAL_KV_CACHE_MIB
    startup_timeout_s: float = 180.0
    leg_timeout_s: float = 60.0
    seed: int = 0  # of the WAN emulation's jitter
    wan_gbps: float | None = None  # every link emulated at this bandwidth instead
    run_dir: str | None = None  # kept there (default: a private temp dir, removed at stop)
    drain_timeout_s: float = 30.0
    api_key: str | None = None
    admin_key: str | None = None
    log_level: str = "warning"
    model: str | None = None  # instead of the graph's model.weights
    chat_template: Path | None = None
    cpu_pinning: str = "auto"  # cpu_layout.MODES: auto | none
    planner: bool | None = None  # pools follow the load (None: the graph's autoscale.enabled)
    engine: str = "real"  # or "modeled": the device model's time, no weights (deploy/modeled.py)
    kv_scale: float = DEFAULT_KV_SCALE  # modeled: a KV payload against the arch's true bytes
    time_scale: float = 1.0  # modeled: every step lasts this many times its modeled time
    profile: str = "local"  # or "production": every declared replica (modeled engine only)
    stream_interval: int = 1  # tokens an SSE chunk waits for (the first and the last go at once)
    api_servers: int = 1  # HTTP processes on the deployment's socket (more: api_processes.py)


class Deployment:
    def __init__(self, plan: Plan, options: DeployOptions | None = None):
        """`plan` as compiled (production scale); everything that can be refused is refused here,
        before anything starts: the backend, the options, the model (DeployError)."""
        self.options = o = options or DeployOptions()
        self.backend_name = o.backend or plan.deploy.backend
        if self.backend_name not in BACKENDS:
            raise OptionError(
                f"unknown backend {self.backend_name!r}; backends: {', '.join(BACKENDS)}"
            )
        if self.backend_name != "ray" and o.address is not None:
            raise OptionError("--address is for --backend ray")
        _check_engine(o)
        self.plan = self._local_plan(plan)
        self.planning = plan.autoscale.enabled if o.planner is None else o.planner
        if self.planning and not self.plan.scalable():
            raise OptionError(
                f"{self.plan.source}: the planner resizes pools within 1..local.max_replicas, and "
                "this graph sets none above its replicas; add e.g. local: {max_replicas: "
                "{prefill: 3, relay: 3, main: 3}}"
            )
        self.model: ModelInfo = self._resolve_model()
        self.wiring: Wiring | None = None
        self.backend: Backend | None = None
        self.frontend: Frontend | None = None
        self.links: LinkAdmin | None = None
        self.supervisor: Supervisor | None = None
        self.run_dir: Path | None = None
        self.cpus = None  # the host's cores as the instances got them (core.cpu_layout)
        self.port = o.port
        self._socket: socket.socket | None = None
        self.api_processes: ApiProcesses | None = None
        self._server = None  # the API server while it serves (api.shutdown.DrainingServer)
        self._scaling = threading.Lock()  # one pool change at a time
        self._ending = threading.Event()  # serving ended: a pool change under way gives up
        self.autoscaler = None  # the planner's thread (runtime/deploy/autoscaler.py)

    def _local_plan(self, plan: Plan) -> Plan:
        """The plan as this deployment runs it: the local profile's replicas, TLS on every
        cross-cluster edge on Ray (the WAN real unless --wan-gbps), the options' link and model."""
        o = self.options
        plan = plan.scaled_to_local() if o.profile == "local" else plan
        if self.backend_name == "ray":
            plan = secure_cross_cluster(plan, emulate=o.wan_gbps is not None)
        if o.wan_gbps is not None:
            links = {n: replace(link, gbps=o.wan_gbps) for n, link in plan.links.items()}
            plan = replace(plan, links=links)
        if o.engine == "modeled":
            try:
                plan = modeled_plan(plan, o.kv_scale)
            except ValueError as exc:
                raise OptionError(str(exc)) from None
        if o.model is not None:
            plan = replace(plan, model=replace(plan.model, weights=o.model))
        return plan

    def _resolve_model(self) -> ModelInfo:
        """Resolved once, here: every worker and the frontend read the same local directory."""
        from pddflow.core.model_config import ModelSpecError
        from pddflow.operators.hub import resolve_model

        try:
            weights = resolve_model(self.plan.model.weights)
            info = model_info(weights, self.options.chat_template)
        except ModelSpecError as exc:
            where = (
                "--model"
                if self.options.model is not None
                else f"{self.plan.source}: model.weights"
            )
            raise DeployError(f"{where}: {exc}") from None
        self.plan = replace(self.plan, model=replace(self.plan.model, weights=weights))
        self._check_layouts(info)
        if self.options.engine == "modeled":  # the arch's context, not the tokenizer model's
            info = replace(info, max_context=self.plan.model.max_context)
        return info

    def _check_layouts(self, info: ModelInfo) -> None:
        """Every tensor-parallel layout splits the served model's heads (before anything starts)."""
        for op in self.plan.operators.values():
            if op.ranks == 1:
                continue
            from pddflow.operators.tensor_parallel import check_layout

            try:
                check_layout(info.config, op.ranks, op.expert_parallel)
            except ValueError as exc:
                where = f"{self.plan.source}: {op.name} deploys {op.ranks} ranks an instance"
                raise DeployError(
                    f"{where}: {exc} (the graph's local: {{devices_per_replica: ...}} sets them)"
                ) from None

    def listen(self) -> None:
        """Take the API's address (OptionError when it is taken); `start` does it first, so that a
        taken port fails before any worker starts."""
        if self._socket is None:
            self._socket = _listen(self.options.host, self.options.port)
            self.port = self._socket.getsockname()[1]

    # ---- start --------------------------------------------------------------------------------
    def start(self, progress: Progress | None = None) -> None:
        """Listen, start every instance and wait until each is ready (DeployError: which one did
        not, and why); the supervisor then restarts any that dies. On failure whatever started is
        stopped."""
        from pddflow.core.cpu_layout import host_cores, plan_layout

        o = self.options
        cpus = self.cpus = plan_layout(self.plan, host_cores(), o.cpu_pinning)
        self.listen()
        kv_bytes = o.kv_cache_mb << 20
        self.wiring = wire(self.plan, o.seed, kv_bytes, o.leg_timeout_s, cpus)
        self.wiring.engine, self.wiring.kv_scale = o.engine, o.kv_scale
        self.wiring.time_scale = o.time_scale
        if o.api_servers > 1:  # each its own token service, where the workers stream its tokens
            host = self.wiring.frontend.rsplit(":", 1)[0]
            self.wiring.api_servers = {n: f"{host}:{free_port()}" for n in api_names(o.api_servers)}
        self.run_dir = make_run_dir(o.run_dir)
        # also when an exception or a second signal cuts stop() short
        atexit.register(remove_run_dir, self.run_dir, o.run_dir is not None)
        self.backend = self._make_backend()
        try:
            self._start_instances(progress)
        except BaseException:
            self.stop()
            raise

    def _make_backend(self) -> Backend:
        if self.backend_name == "ray":
            from pddflow.runtime.deploy.ray_backend import RayBackend

            d = self.plan.deploy
            return RayBackend(
                address=self.options.address or d.address,
                namespace=d.namespace,
                bind_all=d.bind == "all",
                accelerators=d.accelerators,
            )
        from pddflow.runtime.deploy.local import LocalBackend

        return LocalBackend()

    def _start_instances(self, progress: Progress | None) -> None:
        plan, wiring, be = self.plan, self.wiring, self.backend
        if any(c.cross_cluster and c.params.get("tls") for c in plan.channels):
            from pddflow.channels.security import self_signed

            # the emulated datacenters trust one self-signed certificate
            tls = self_signed(self.run_dir / "tls")
            wiring.tls_cert, wiring.tls_key = tls.cert_chain, tls.private_key
        wiring.cache_dir = str(self.run_dir / "kv")
        be.start(plan, wiring, self.run_dir)  # before any gRPC thread here: children fork cleanly
        self.frontend = Frontend(
            plan, wiring, self.model, stream_interval=self.options.stream_interval
        )
        wait_ready(self.frontend.ready_count, be, self.options.startup_timeout_s, progress)
        self.links = LinkAdmin(plan, self.frontend.fleet.clients, be.cutter(), be.impairer())
        # a worker that dies is restarted; until it is back, requests go around it
        self.supervisor = Supervisor(be, self.frontend.worker_exited, self._restarted).start()
        if self.planning:
            from pddflow.runtime.deploy.autoscaler import Autoscaler

            self.autoscaler = Autoscaler(plan, self.frontend, self.scale)
            self.frontend.planner = self.autoscaler
            self.autoscaler.start()

    def _restarted(self, instance: str, restarts: int) -> None:
        self.frontend.worker_restarted(instance, restarts)
        self.links.restarted(instance)  # it shapes its links as declared: re-tell a degrade

    # ---- live scaling --------------------------------------------------------------------------
    def scale(self, operator: str, replicas: int, say: Callable[[str], None] = log.warning) -> dict:
        """Run `replicas` instances of `operator` (ScaleError: bounds, a start that failed, a
        change already under way). Up: the next parked instances start and join routing once
        ready. Down: the highest-numbered are drained (no new work; their legs finish, or past
        --drain-timeout carry on elsewhere as for a lost worker), then stopped. The pool's state
        as /health shows it."""
        fe, be = self.frontend, self.backend
        if fe is None or be is None:
            raise ScaleError("the deployment is not running")
        op = self.plan.operators.get(operator)
        if op is None:
            raise ScaleError(
                f"no operator {operator!r}; operators: {', '.join(self.plan.operators)}",
                status=404,
            )
        if not 1 <= replicas <= len(op.instances):
            raise ScaleError(
                f"{operator} scales within 1..{len(op.instances)} (local.max_replicas), "
                f"not to {replicas}"
            )
        if not self._scaling.acquire(blocking=False):
            raise ScaleError("another pool change is under way; retry when it ends", status=409)
        try:
            start, stop = pool_moves(op.instances, fe.fleet.parked, replicas)
            for inst in start:
                self._start_one(inst, say)
            for inst in stop:
                self._stop_one(inst, say)
        finally:
            self._scaling.release()
        return fe.pools.state()[operator]

    def _start_one(self, inst: str, say: Callable[[str], None]) -> None:
        fe, be = self.frontend, self.backend
        say(f"scaling up: starting {inst}")
        fe.pools.expect(inst)
        be.start_instance(inst)
        deadline = time.monotonic() + self.options.startup_timeout_s
        while inst in fe.fleet.starting:
            why = self._start_failed(inst, deadline)
            if why:
                be.stop_instance(inst)
                self._forget(inst)
                fe.pools.park(inst)
                raise ScaleError(f"{inst} did not start: {why}", status=503)
            time.sleep(0.1)
        say(f"scaling up: {inst} serves")

    def _start_failed(self, inst: str, deadline: float) -> str | None:
        """Why a start under way has failed, or None while it may still succeed."""
        if self._ending.is_set():
            return "the deployment is stopping"
        if not self.backend.alive(inst):
            return self.backend.exit_summary(inst)
        return "not ready in time" if time.monotonic() > deadline else None

    def _stop_one(self, inst: str, say: Callable[[str], None]) -> None:
        fe, be = self.frontend, self.backend
        say(f"scaling down: draining {inst}")
        fe.pools.drain(inst)
        deadline = time.monotonic() + self.options.drain_timeout_s
        while not self._ending.is_set() and fe.pools.busy(inst) and time.monotonic() < deadline:
            time.sleep(0.1)
        held = fe.pools.busy(inst)
        if held:
            say(f"scaling down: {inst} still holds {held} legs after the drain: they move on")
        fe.pools.park(inst)  # its legs, if any, go on elsewhere before the process stops
        be.stop_instance(inst)
        self._forget(inst)
        say(f"scaling down: {inst} stopped")

    def _forget(self, inst: str) -> None:
        """A stopped instance: no restart due (one lost while starting or draining)."""
        if self.supervisor is not None:
            self.supervisor.forget(inst)

    def placement(self) -> str:
        """Where the instances run, in one line: their nodes (ray), or their cores (local)."""
        if self.backend_name == "ray":
            placed = self.backend.placement()
            return "placement: " + "; ".join(
                f"{i} on {p['node_ip']} (node {p['node'][:12]})" for i, p in placed.items()
            )
        return f"cpus: {self.cpus.describe()}"

    # ---- serve --------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.options.host}:{self.port}/v1"

    def serve(self, say: Callable[[str], None] = print) -> None:
        """The OpenAI API on the deployment's socket until SIGINT / SIGTERM (in the main thread)
        or `stop_serving()`; then new requests get 503 and running ones have --drain-timeout to
        finish. `say` hears the drain's progress."""
        import uvicorn

        from pddflow.runtime.api.admission import Admission
        from pddflow.runtime.api.app import make_app
        from pddflow.runtime.api.shutdown import DrainingServer

        o, admission = self.options, Admission()
        app = make_app(
            self.frontend,
            admission,
            api_key=o.api_key,
            admin_key=o.admin_key,
            links=self.links,
            placement=self._placement,
            scale=self.scale if self.plan.scalable() else None,
        )
        sock, also_stop = self._socket, None
        if o.api_servers > 1:  # they serve the socket; this process, the router, its own
            sock = _listen("127.0.0.1", 0)
            self._start_api_processes(f"http://127.0.0.1:{sock.getsockname()[1]}")
            also_stop = self._stop_api_processes
        config = uvicorn.Config(
            app,
            host=o.host,
            port=sock.getsockname()[1],
            log_level=o.log_level,
            access_log=False,
            timeout_graceful_shutdown=5,  # the drain has ended every request by then
        )
        self._server = DrainingServer(config, admission, o.drain_timeout_s, say, also_stop)
        try:
            self._server.run(sockets=[sock])
        finally:  # the planner measures on the frontend's loop, which stops with the server
            self._stop_api_processes(now=True)
            if sock is not self._socket:
                sock.close()
            self._stop_planner()

    def _placement(self) -> dict[str, Any]:
        placed = self.backend.describe()
        if self.api_processes is not None:
            placed["api_servers"] = self.api_processes.describe()
        return placed

    def _start_api_processes(self, router_http: str) -> None:
        o, keys = self.options, {}
        if o.api_key:
            keys["PDDFLOW_API_KEY"] = o.api_key
        if o.admin_key:
            keys["PDDFLOW_ADMIN_KEY"] = o.admin_key
        wiring_file = self.run_dir / "api-wiring.json"
        private_file(wiring_file)  # it holds the deployment's bearer token
        self.wiring.save(wiring_file)
        self.api_processes = ApiProcesses.start(
            self.wiring,
            wiring_file,
            self._socket,
            router_http,
            self.run_dir,
            stream_interval=o.stream_interval,
            drain_timeout_s=o.drain_timeout_s,
            log_level=o.log_level,
            modeled=o.engine == "modeled",
            chat_template=o.chat_template,
            keys=keys,
        )
        why = self.api_processes.wait_ready(o.startup_timeout_s)
        if why:
            self._stop_api_processes(now=True)
            raise DeployError(f"an API process did not start: {why}")

    def _stop_api_processes(self, now: bool = False) -> None:
        procs, self.api_processes = self.api_processes, None
        if procs is not None:
            procs.stop(now, grace_s=self.options.drain_timeout_s + 10)

    def _stop_planner(self) -> None:
        self._ending.set()  # a scale it has under way stops waiting for a start or a drain
        if self.autoscaler is not None:
            self.autoscaler.stop()
            self.autoscaler = None

    def stop_serving(self) -> None:
        """From another thread: drain and end `serve()` as a signal would."""
        if self._server is not None:
            self._server.handle_exit(0, None)

    # ---- stop ---------------------------------------------------------------------------------
    def stop(self) -> None:
        """Every instance stopped, the frontend closed, the run directory removed (or, kept, its
        secrets); safe to call twice."""
        self._stop_planner()  # first: no pool change while everything stops
        self._stop_api_processes(now=True)
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        if self.backend is not None:
            self.backend.stop()
            self.backend = None
        if self.frontend is not None:
            self.frontend.close()
            self.frontend = None
        if self.wiring is not None:  # a worker killed without its close() left its arena
            remove_disk_tiers(self.plan, self.wiring)
        if self.run_dir is not None:
            remove_run_dir(self.run_dir, kept=self.options.run_dir is not None)
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT is no owner
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        msg = f"cannot listen on {host}:{port}: {exc.strerror}; choose another --port"
        raise OptionError(msg) from None
    return sock


def pool_moves(
    instances: tuple[str, ...], parked: set[str], replicas: int
) -> tuple[list[str], list[str]]:
    """The instances to start (the next parked ones) and to stop (the highest-numbered running
    ones, last first) for a pool to run `replicas`."""
    running = [i for i in instances if i not in parked]
    idle = [i for i in instances if i in parked]
    return idle[: max(0, replicas - len(running))], running[replicas:][::-1]


def _check_engine(o: DeployOptions) -> None:
    try:
        check_engine_profile(o.engine, o.profile)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    if not 0 < o.kv_scale <= 1:
        raise OptionError(f"--kv-scale must be in (0, 1], got {o.kv_scale}")
    if o.time_scale <= 0:
        raise OptionError(f"--time-scale must be > 0, got {o.time_scale}")
