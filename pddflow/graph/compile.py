"""Semantic stage and compiler: GraphSpec -> Plan. Edge checks live in edges.py, variant checks
in variants.py; they take what the compiler resolved (`Resolved`), not the compiler.

Every check reports through `Source.error`, so a file gets all its problems at once, each naming
the line, the evidence on both sides and the fix. A Plan is returned only when nothing is wrong.
"""

from __future__ import annotations

import os
from typing import Any

from pddflow.core.arch import ARCHS, FROM_CHECKPOINT, ModelArch
from pddflow.core.device import GIB, DeviceClass
from pddflow.core.hf_config import checkpoint_arch
from pddflow.core.link import Jitter, LinkModel, window_stream_gbps
from pddflow.core.model_config import BUILTIN_CONFIGS, ModelSpecError
from pddflow.core.model_ref import is_hub_id
from pddflow.core.operator_types import OPERATOR_TYPES, OperatorType
from pddflow.core.policies import POLICIES
from pddflow.core.registry import did_you_mean
from pddflow.graph.autoscale import check_autoscale
from pddflow.graph.cache_tiers import disk_cache, host_cache, local_cache_mib
from pddflow.graph.edges import check_cycles, check_edges, check_unfed_inputs
from pddflow.graph.params import check_params
from pddflow.graph.plan import (
    ClusterPlan,
    DeployPlan,
    ModelPlan,
    OperatorPlan,
    Plan,
    SchedulerPlan,
    Shape,
    _instances,
)
from pddflow.graph.resolved import Resolved
from pddflow.graph.spec import ArchNumbers, GraphSpec
from pddflow.graph.variants import check_variants
from pddflow.graph.yaml_source import Source

MEMORY_HEADROOM = 0.9  # share of device memory usable for weights + KV (activations, fragmentation)


class Compiler:
    def __init__(self, spec: GraphSpec, src: Source):
        self.spec, self.src = spec, src
        self.arch: ModelArch | None = None
        self.types: dict[str, OperatorType] = {}
        self.links: dict[str, LinkModel] = {}

    def err(self, path: tuple, message: str, key: bool = False, severity: str = "error") -> None:
        self.src.error(path, message, key=key, severity=severity)

    # ---- the stages -------------------------------------------------------------------------
    def compile(self) -> Plan | None:
        before = self._error_count()
        model = self._model()
        devices = {n: DeviceClass(n, **d.model_dump()) for n, d in self.spec.device_classes.items()}
        clusters = self._clusters(devices)
        self._links(clusters)
        operators = self._operators(clusters, devices)
        # the edge and variant checks read what the stages above resolved
        resolved = Resolved(self.spec, self.src, self.types, self.links)
        edges = check_edges(resolved, operators)
        check_unfed_inputs(resolved, operators, edges.fed)
        check_cycles(resolved, edges.valid)
        variants = check_variants(resolved, operators, edges)
        scheduler = self._scheduler()
        local = self._local("replicas")
        local_max = self._local_max(local)
        local_devices = self._local_devices()
        autoscale = check_autoscale(self.spec, self.src)
        deploy = self._deploy()
        if self._error_count() > before or model is None:
            return None
        return Plan(
            name=self.spec.name,
            source=self.src.file,
            model=model,
            device_classes=devices,
            clusters=clusters,
            links=self.links,
            operators=operators,
            instances=_instances(operators),
            channels=edges.channels,
            variants=variants,
            scheduler=scheduler,
            local_replicas=local,
            local_max_replicas=local_max,
            local_devices=local_devices,
            local_cache_mib=local_cache_mib(self.err, self.spec),
            local_scheduler_params=self._local_scheduler(scheduler),
            deploy=deploy,
            autoscale=autoscale,
        )

    def _deploy(self) -> DeployPlan:
        d = self.spec.deploy.model_dump()
        front = d["frontend_cluster"] or next(iter(self.spec.clusters))
        if front not in self.spec.clusters:
            self.err(
                ("deploy", "frontend_cluster"),
                f"frontend_cluster {front!r} is not a cluster of this graph"
                f"{did_you_mean(front, list(self.spec.clusters))}; clusters: "
                f"{', '.join(self.spec.clusters)}",
            )
        d["frontend_cluster"] = front
        return DeployPlan(**d)

    def _error_count(self) -> int:
        return sum(1 for d in self.src.errors if d.severity == "error")

    def _model(self) -> ModelPlan | None:
        m = self.spec.model
        weights = self._weights()
        if isinstance(m.arch, ArchNumbers):
            self.arch = ModelArch("inline", **m.arch.model_dump())
        elif m.arch == FROM_CHECKPOINT:
            try:
                self.arch = checkpoint_arch(weights)
            except ModelSpecError as exc:
                self.err(("model", "arch"), f"arch: {FROM_CHECKPOINT} reads model.weights: {exc}")
        elif m.arch in ARCHS:
            self.arch = ARCHS.get(m.arch)
        else:
            self.err(
                ("model", "arch"),
                f"unknown model architecture {m.arch!r}{did_you_mean(m.arch, ARCHS.names())}; "
                f"presets: {', '.join(ARCHS.names())}, {FROM_CHECKPOINT!r} (the weights' "
                "config.json), or give kv_bytes_per_token, flops_per_token and weight_bytes",
            )
        if m.block_size & (m.block_size - 1):
            self.err(
                ("model", "block_size"),
                f"block_size {m.block_size} is not a power of two; use 16 or 32",
            )
        return ModelPlan(weights, self.arch, m.max_context, m.block_size) if self.arch else None

    def _weights(self) -> str:
        """model.weights resolved: a checkpoint directory relative to the graph file made
        absolute (a warning when it is not there), a Hub id or builtin as it is."""
        m = self.spec.model
        weights = m.weights
        if weights.startswith("builtin:"):
            name = weights.split(":", 1)[1]
            if name not in BUILTIN_CONFIGS:
                self.err(
                    ("model", "weights"),
                    f"unknown built-in model {name!r}{did_you_mean(name, BUILTIN_CONFIGS)}; "
                    f"built-in: {', '.join('builtin:' + b for b in BUILTIN_CONFIGS)}",
                )
        else:
            base = os.path.dirname(os.path.abspath(self.src.file))
            resolved = (
                weights if os.path.isabs(weights) else os.path.normpath(os.path.join(base, weights))
            )
            if not os.path.exists(resolved) and is_hub_id(weights):
                resolved = weights  # a Hub id: `deploy` resolves it through the Hub's cache
            elif not os.path.isfile(os.path.join(resolved, "config.json")):
                self.err(
                    ("model", "weights"),
                    f"no checkpoint at {resolved} (expected config.json and *.safetensors); "
                    "`deploy` needs it, `plan` and `simulate` do not",
                    severity="warning",
                )
            weights = resolved
        return weights

    def _clusters(self, devices: dict[str, DeviceClass]) -> dict[str, ClusterPlan]:
        out = {}
        for name, c in self.spec.clusters.items():
            for dev, count in c.devices.items():
                if dev not in devices:
                    self.err(
                        ("clusters", name, "devices", dev),
                        f"cluster {name} lists device class {dev!r}, which "
                        f"device_classes does not define{did_you_mean(dev, devices)}",
                        key=True,
                    )
                if count < 0:
                    self.err(
                        ("clusters", name, "devices", dev),
                        f"device count must be >= 0, got {count}",
                    )
            nets = [devices[d].net_gbps for d in c.devices if d in devices]
            out[name] = ClusterPlan(
                name, dict(c.devices), c.rdma_gbps or (min(nets) if nets else 0.0)
            )
        return out

    def _links(self, clusters: dict[str, ClusterPlan]) -> None:
        pairs: dict[frozenset, str] = {}
        for name, link in self.spec.links.items():
            ends = link.between or name.split("-")
            if len(ends) != 2:
                self.err(
                    ("links", name),
                    f"link {name!r}: cannot tell which clusters it joins; name it `A-B` or add "
                    "`between: [A, B]`",
                    key=True,
                )
                continue
            bad = False
            for end in ends:
                if end not in clusters:
                    bad = True
                    self.err(
                        ("links", name, "between") if link.between else ("links", name),
                        f"link {name!r} joins cluster {end!r}, which is not defined"
                        f"{did_you_mean(end, clusters)}; clusters: {', '.join(clusters)}",
                        key=not link.between,
                    )
            if ends[0] == ends[1]:
                self.err(
                    ("links", name),
                    f"link {name!r} joins cluster {ends[0]} to itself; intra-cluster traffic uses "
                    "the cluster's RDMA fabric (rdma_gbps)",
                    key=True,
                )
                bad = True
            if link.jitter.p99_ms < link.jitter.p50_ms:
                self.err(
                    ("links", name, "jitter", "p99_ms"),
                    f"jitter p99_ms ({link.jitter.p99_ms}) is below p50_ms "
                    f"({link.jitter.p50_ms}); a 99th percentile cannot be smaller than the median",
                )
            pair = frozenset(ends)
            if pair in pairs and not bad:
                self.err(
                    ("links", name),
                    f"link {name!r} joins the same clusters as link {pairs[pair]!r}; "
                    "merge them (bandwidth adds up)",
                    key=True,
                )
            pairs.setdefault(pair, name)
            if not bad:
                self.links[name] = LinkModel(
                    name,
                    ends[0],
                    ends[1],
                    link.gbps,
                    link.rtt_ms,
                    Jitter(link.jitter.p50_ms, link.jitter.p99_ms, link.jitter.dist),
                    link.stream_gbps
                    if link.stream_gbps is not None
                    else window_stream_gbps(link.tcp_window_mib, link.rtt_ms),
                )

    def _operators(
        self, clusters: dict[str, ClusterPlan], devices: dict[str, DeviceClass]
    ) -> dict[str, OperatorPlan]:
        out: dict[str, OperatorPlan] = {}
        used: dict[tuple[str, str], list[str]] = {}
        for name, o in self.spec.operators.items():
            at = ("operators", name)
            if "." in name or "/" in name:
                self.err(
                    at,
                    f"operator name {name!r} may not contain '.' or '/' "
                    "(edges write `operator.port`)",
                    key=True,
                )
            ok = True
            if o.op not in OPERATOR_TYPES:
                ok = False
                self.err(
                    at + ("op",),
                    f"unknown operator type {o.op!r}{did_you_mean(o.op, OPERATOR_TYPES.names())}; "
                    f"types: {', '.join(OPERATOR_TYPES.names())}",
                )
            if o.cluster not in clusters:
                ok = False
                self.err(
                    at + ("cluster",),
                    f"operator {name} is placed in cluster {o.cluster!r}, which is not "
                    f"defined{did_you_mean(o.cluster, clusters)}; clusters: {', '.join(clusters)}",
                )
            if (
                self._device_problem(
                    at + ("device",),
                    o.device,
                    o.cluster,
                    clusters,
                    devices,
                    f"operator {name} runs on",
                    "",
                    "place the operator elsewhere",
                )
                == "undefined"
            ):
                ok = False
            if not ok:
                continue
            optype = self.types[name] = OPERATOR_TYPES.get(o.op)
            params = check_params(
                self.src, at + ("params",), optype.params, o.params, f"operator type {o.op}"
            )
            used.setdefault((o.cluster, o.device), []).append(name)
            at_dpr = at + ("devices_per_replica",)
            budget = self._memory(name, o.devices_per_replica, devices[o.device], at_dpr)
            out[name] = OperatorPlan(
                name,
                o.op,
                optype.role,
                o.cluster,
                o.device,
                o.replicas,
                o.devices_per_replica,
                params,
                budget,
                tuple(f"{name}/{i}" for i in range(o.replicas)),
                self._choices(name, o, clusters, devices),
                host_cache(self.err, name, o, params),
                disk_cache(self.err, name, o, params),
            )
        for (cluster, dev), names in used.items():
            need = sum(
                self.spec.operators[n].replicas * self.spec.operators[n].devices_per_replica
                for n in names
            )
            have = clusters[cluster].devices.get(dev, 0)
            if need > have and dev in clusters[cluster].devices:
                ops = self.spec.operators
                detail = " + ".join(
                    f"{n} {ops[n].replicas}x{ops[n].devices_per_replica}" for n in names
                )
                self.err(
                    ("operators", names[-1], "replicas"),
                    f"cluster {cluster} has {have} {dev} devices but its "
                    f"operators need {need} ({detail}); lower replicas or add devices to "
                    f"clusters.{cluster}",
                )
        return out

    def _choices(
        self,
        name: str,
        o: Any,
        clusters: dict[str, ClusterPlan],
        devices: dict[str, DeviceClass],
    ) -> tuple[Shape, ...]:
        """The other shapes `pddflow size` may pick, each checked as the declared one is."""
        out: list[Shape] = []
        seen = {(o.device, o.devices_per_replica)}
        for i, c in enumerate(o.choices):
            at = ("operators", name, "choices", i)
            dev = c.device or o.device
            dpr = c.devices_per_replica or o.devices_per_replica
            who = f"choice {i} of operator {name}"
            if self._device_problem(
                at, dev, o.cluster, clusters, devices, f"{who} names", f"{who}: ", "drop the choice"
            ):
                continue
            if (dev, dpr) in seen:
                continue
            seen.add((dev, dpr))
            budget = self._memory(name, dpr, devices[dev], at, f"choice {i} of {name}: ")
            out.append(Shape(dev, dpr, budget))
        return tuple(out)

    def _device_problem(
        self,
        at: tuple,
        dev: str,
        cluster: str,
        clusters: dict[str, ClusterPlan],
        devices: dict[str, DeviceClass],
        uses: str,
        prefix: str,
        fix: str,
    ) -> str:
        """ "undefined" or "absent" (the cluster lacks it), said at `at`; "" when the device class
        is defined and, where the cluster is, in it."""
        if dev not in devices:
            self.err(
                at,
                f"{uses} device class {dev!r}, which is not defined"
                f"{did_you_mean(dev, devices)}; classes: {', '.join(devices)}",
            )
            return "undefined"
        if cluster in clusters and dev not in clusters[cluster].devices:
            self.err(
                at,
                f"{prefix}cluster {cluster} has no {dev} devices (it has: "
                f"{', '.join(clusters[cluster].devices) or 'none'}); add {dev} to "
                f"clusters.{cluster}.devices or {fix}",
            )
            return "absent"
        return ""

    def _memory(
        self, name: str, devices_per_replica: int, dev: DeviceClass, at: tuple, what: str = ""
    ) -> float:
        if self.arch is None:
            return 0.0
        max_context = self.spec.model.max_context
        usable = MEMORY_HEADROOM * dev.hbm_bytes * devices_per_replica
        budget = usable - self.arch.weight_bytes
        if budget <= 0:
            need = -(-self.arch.weight_bytes // int(MEMORY_HEADROOM * dev.hbm_bytes))
            self.err(
                at,
                f"{what}the {self.arch.name} weights need "
                f"{self.arch.weight_bytes / GIB:.0f} GiB but {devices_per_replica} x {dev.name} "
                f"give {usable / GIB:.0f} GiB usable; set devices_per_replica >= {need + 1}",
            )
        elif budget < (one_request := self.arch.kv_bytes_per_token * max_context):
            self.err(
                at,
                f"{what}after weights, {name} has {budget / GIB:.1f} GiB for "
                f"KV, less than one max_context request ({max_context} tokens x "
                f"{self.arch.kv_bytes_per_token} B = {one_request / GIB:.1f} GiB); "
                "raise devices_per_replica or lower model.max_context",
            )
        return max(budget, 0.0)

    def _scheduler(self) -> SchedulerPlan:
        s = self.spec.scheduler
        params: dict[str, Any] = {}
        if s.policy not in POLICIES:
            self.err(
                ("scheduler", "policy"),
                f"unknown scheduler policy {s.policy!r}{did_you_mean(s.policy, POLICIES.names())}; "
                f"policies: {', '.join(POLICIES.names())}",
            )
        else:
            params = check_params(
                self.src,
                ("scheduler", "params"),
                POLICIES.get(s.policy).params,
                s.params,
                f"policy {s.policy}",
            )
        return SchedulerPlan(s.policy, s.sla.ttft_s, s.sla.tpot_ms, params)

    def _local_scheduler(self, scheduler: SchedulerPlan) -> dict[str, Any]:
        given = self.spec.local.scheduler
        if not given or scheduler.policy not in POLICIES:
            return {}
        declared = POLICIES.get(scheduler.policy).params
        checked = check_params(
            self.src, ("local", "scheduler"), declared, given, f"policy {scheduler.policy}"
        )
        return {k: checked[k] for k in given if k in declared}

    def _local(self, section: str) -> dict[str, int]:
        """The local profile's `replicas` or `devices_per_replica`: operator -> a count >= 1."""
        out = {}
        for name, n in getattr(self.spec.local, section).items():
            at = ("local", section, name)
            if name not in self.spec.operators:
                self.err(
                    at,
                    f"local profile names operator {name!r}, which is not defined"
                    f"{did_you_mean(name, self.spec.operators)}",
                    key=True,
                )
            elif n < 1:
                self.err(at, f"local {section} must be >= 1, got {n}")
            else:
                out[name] = n
        return out

    def _local_max(self, replicas: dict[str, int]) -> dict[str, int]:
        """The local profile's bounds for live scaling: at least the replicas it starts with."""
        out = self._local("max_replicas")
        for name, n in out.items():
            start = replicas.get(name, 1)
            if n < start:
                self.err(
                    ("local", "max_replicas", name),
                    f"local max_replicas of {name} is {n} but it starts with {start} "
                    f"(local.replicas); set at least {start}",
                )
        return out

    def _local_devices(self) -> dict[str, int]:
        """The layout the local profile deploys: a replica's devices, or fewer."""
        out = self._local("devices_per_replica")
        for name, n in out.items():
            declared = self.spec.operators[name].devices_per_replica
            if n > declared:
                self.err(
                    ("local", "devices_per_replica", name),
                    f"local devices_per_replica of {name} is {n} but a replica of it has "
                    f"{declared} devices (operators.{name}.devices_per_replica); the local profile "
                    f"may shrink a layout, not grow it: set at most {declared}",
                )
        return out
