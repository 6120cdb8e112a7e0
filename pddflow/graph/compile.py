"""Semantic stage and compiler: GraphSpec -> edge index -> Plan (Plan.to_networkx() for the graph).

Every check reports through `Source.error`, so a file gets all its problems at once, each naming
the line, the evidence on both sides and the fix. A Plan is returned only when nothing is wrong.
"""

from __future__ import annotations

import os
from typing import Any

from pddflow.core.arch import ARCHS, ModelArch
from pddflow.core.channel_kinds import CHANNEL_KINDS
from pddflow.core.device import GIB, DeviceClass
from pddflow.core.link import Jitter, LinkModel
from pddflow.core.operator_types import OPERATOR_TYPES, OperatorType, Param
from pddflow.core.payloads import Payload
from pddflow.core.policies import POLICIES
from pddflow.core.registry import did_you_mean
from pddflow.graph.plan import (
    ChannelPlan,
    ClusterPlan,
    ModelPlan,
    OperatorPlan,
    Plan,
    SchedulerPlan,
    VariantPlan,
    _instances,
)
from pddflow.graph.spec import ArchNumbers, GraphSpec
from pddflow.graph.yaml_source import Source

BUILTIN_MODELS = ("tiny-llama",)
MEMORY_HEADROOM = 0.9  # share of device memory usable for weights + KV (activations, fragmentation)


class EdgeIndex:
    """Operator-to-operator edges keyed by edge id. A plain index, not networkx: validating must
    stay instant and networkx alone costs ~0.2 s to import (Plan.to_networkx() gives the graph)."""

    def __init__(self) -> None:
        self._out: dict[str, dict[str, dict[str, dict]]] = {}

    def add(self, src: str, dst: str, key: str, **data: Any) -> None:
        self._out.setdefault(src, {}).setdefault(dst, {})[key] = data

    def has(self, src: str, dst: str) -> bool:
        return bool(self._out.get(src, {}).get(dst))

    def between(self, src: str, dst: str) -> dict[str, dict]:
        return self._out.get(src, {}).get(dst, {})

    def cycles(self) -> list[list[str]]:
        """One cycle per back edge found by depth-first search (enough to report each loop)."""
        found, state, stack = [], {}, []

        def visit(n: str) -> None:
            state[n] = 1
            stack.append(n)
            for m in self._out.get(n, {}):
                if state.get(m) == 1:
                    found.append(stack[stack.index(m) :])
                elif m not in state:
                    visit(m)
            stack.pop()
            state[n] = 2

        for n in list(self._out):
            if n not in state:
                visit(n)
        return found


class Compiler:
    def __init__(self, spec: GraphSpec, src: Source):
        self.spec, self.src = spec, src
        self.arch: ModelArch | None = None
        self.types: dict[str, OperatorType] = {}
        self.links: dict[str, LinkModel] = {}
        self.graph = EdgeIndex()  # the valid edges: what the Plan is built from
        self.declared = EdgeIndex()  # every edge whose endpoints exist, valid or not
        self.declared_inputs: set[tuple[str, str]] = set()

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
        channels = self._edges(operators, clusters)
        self._unfed_inputs(operators, channels)
        self._cycles(channels)
        variants = self._variants(operators)
        scheduler = self._scheduler()
        local = self._local(operators)
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
            channels=tuple(channels),
            variants=variants,
            scheduler=scheduler,
            local_replicas=local,
        )

    def _error_count(self) -> int:
        return sum(1 for d in self.src.errors if d.severity == "error")

    def _model(self) -> ModelPlan | None:
        m = self.spec.model
        if isinstance(m.arch, ArchNumbers):
            self.arch = ModelArch("inline", **m.arch.model_dump())
        elif m.arch in ARCHS:
            self.arch = ARCHS.get(m.arch)
        else:
            self.err(
                ("model", "arch"),
                f"unknown model architecture {m.arch!r}{did_you_mean(m.arch, ARCHS.names())}; "
                f"presets: {', '.join(ARCHS.names())}, or give kv_bytes_per_token, flops_per_token and weight_bytes",
            )
        weights = m.weights
        if weights.startswith("builtin:"):
            name = weights.split(":", 1)[1]
            if name not in BUILTIN_MODELS:
                self.err(
                    ("model", "weights"),
                    f"unknown built-in model {name!r}{did_you_mean(name, BUILTIN_MODELS)}; "
                    f"built-in: {', '.join('builtin:' + b for b in BUILTIN_MODELS)}",
                )
        else:
            base = os.path.dirname(os.path.abspath(self.src.file))
            resolved = (
                weights if os.path.isabs(weights) else os.path.normpath(os.path.join(base, weights))
            )
            if not os.path.isfile(os.path.join(resolved, "config.json")):
                self.err(
                    ("model", "weights"),
                    f"no checkpoint at {resolved} (expected config.json and *.safetensors); "
                    "`deploy` needs it, `plan` and `simulate` do not",
                    severity="warning",
                )
            weights = resolved
        if m.block_size & (m.block_size - 1):
            self.err(
                ("model", "block_size"),
                f"block_size {m.block_size} is not a power of two; use 16 or 32",
            )
        return ModelPlan(weights, self.arch, m.max_context, m.block_size) if self.arch else None

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
        for name, l in self.spec.links.items():
            ends = l.between or name.split("-")
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
                        ("links", name, "between") if l.between else ("links", name),
                        f"link {name!r} joins cluster {end!r}, which is not defined{did_you_mean(end, clusters)}; "
                        f"clusters: {', '.join(clusters)}",
                        key=not l.between,
                    )
            if ends[0] == ends[1]:
                self.err(
                    ("links", name),
                    f"link {name!r} joins cluster {ends[0]} to itself; intra-cluster traffic uses "
                    "the cluster's RDMA fabric (rdma_gbps)",
                    key=True,
                )
                bad = True
            if l.jitter.p99_ms < l.jitter.p50_ms:
                self.err(
                    ("links", name, "jitter", "p99_ms"),
                    f"jitter p99_ms ({l.jitter.p99_ms}) is below p50_ms "
                    f"({l.jitter.p50_ms}); a 99th percentile cannot be smaller than the median",
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
                    l.gbps,
                    l.rtt_ms,
                    Jitter(l.jitter.p50_ms, l.jitter.p99_ms, l.jitter.dist),
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
                    f"operator name {name!r} may not contain '.' or '/' (edges write `operator.port`)",
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
            if o.device not in devices:
                ok = False
                self.err(
                    at + ("device",),
                    f"operator {name} runs on device class {o.device!r}, which is not "
                    f"defined{did_you_mean(o.device, devices)}; classes: {', '.join(devices)}",
                )
            elif o.cluster in clusters and o.device not in clusters[o.cluster].devices:
                self.err(
                    at + ("device",),
                    f"cluster {o.cluster} has no {o.device} devices (it has: "
                    f"{', '.join(clusters[o.cluster].devices) or 'none'}); add {o.device} to clusters.{o.cluster}.devices "
                    "or place the operator elsewhere",
                )
            if not ok:
                continue
            optype = self.types[name] = OPERATOR_TYPES.get(o.op)
            params = check_params(
                self.src, at + ("params",), optype.params, o.params, f"operator type {o.op}"
            )
            used.setdefault((o.cluster, o.device), []).append(name)
            budget = self._memory(name, o, devices[o.device])
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
            )
        for (cluster, dev), names in used.items():
            need = sum(
                self.spec.operators[n].replicas * self.spec.operators[n].devices_per_replica
                for n in names
            )
            have = clusters[cluster].devices.get(dev, 0)
            if need > have and dev in clusters[cluster].devices:
                detail = " + ".join(
                    f"{n} {self.spec.operators[n].replicas}x{self.spec.operators[n].devices_per_replica}"
                    for n in names
                )
                self.err(
                    ("operators", names[-1], "replicas"),
                    f"cluster {cluster} has {have} {dev} devices but its "
                    f"operators need {need} ({detail}); lower replicas or add devices to clusters.{cluster}",
                )
        return out

    def _memory(self, name: str, o: Any, dev: DeviceClass) -> float:
        if self.arch is None:
            return 0.0
        usable = MEMORY_HEADROOM * dev.hbm_bytes * o.devices_per_replica
        budget = usable - self.arch.weight_bytes
        if budget <= 0:
            need = -(-self.arch.weight_bytes // int(MEMORY_HEADROOM * dev.hbm_bytes))
            self.err(
                ("operators", name, "devices_per_replica"),
                f"the {self.arch.name} weights need "
                f"{self.arch.weight_bytes / GIB:.0f} GiB but {o.devices_per_replica} x {dev.name} give "
                f"{usable / GIB:.0f} GiB usable; set devices_per_replica >= {need + 1}",
            )
        elif budget < self.arch.kv_bytes_per_token * self.spec.model.max_context:
            self.err(
                ("operators", name, "devices_per_replica"),
                f"after weights, {name} has {budget / GIB:.1f} GiB for "
                f"KV, less than one max_context request ({self.spec.model.max_context} tokens x "
                f"{self.arch.kv_bytes_per_token} B = {self.arch.kv_bytes_per_token * self.spec.model.max_context / GIB:.1f} GiB); "
                "raise devices_per_replica or lower model.max_context",
            )
        return max(budget, 0.0)

    def _edges(
        self, ops: dict[str, OperatorPlan], clusters: dict[str, ClusterPlan]
    ) -> list[ChannelPlan]:
        out: list[ChannelPlan] = []
        seen: set[str] = set()
        for i, e in enumerate(self.spec.edges):
            at = ("edges", i)
            src = self._endpoint(at + ("from",), e.from_, "outputs")
            dst = self._endpoint(at + ("to",), e.to, "inputs")
            kind = None
            if e.channel not in CHANNEL_KINDS:
                self.err(
                    at + ("channel",),
                    f"unknown channel kind {e.channel!r}{did_you_mean(e.channel, CHANNEL_KINDS.names())}; "
                    f"kinds: {', '.join(CHANNEL_KINDS.names())}",
                )
            else:
                kind = CHANNEL_KINDS.get(e.channel)
            if dst:
                self.declared_inputs.add((dst[0], dst[1]))
            if src and dst:
                self.declared.add(src[0], dst[0], f"{e.from_}->{e.to}", payload=str(src[2]))
            if not (src and dst and kind):
                continue
            (s_op, s_port, s_type), (d_op, d_port, d_type) = src, dst
            if s_type != d_type:
                self.err(
                    at + ("to",),
                    f"type mismatch: {e.from_} sends {s_type} but {e.to} takes {d_type}",
                )
                continue
            if s_type not in kind.carries:
                fits = [
                    k
                    for k in CHANNEL_KINDS.names()
                    if s_type in CHANNEL_KINDS.get(k).carries and k != "local"
                ]
                self.err(
                    at + ("channel",),
                    f"channel {kind.name} carries {', '.join(sorted(map(str, kind.carries)))} but "
                    f"{e.from_} sends {s_type}; use {' or '.join(fits)}",
                )
                continue
            a, b = ops[s_op].cluster, ops[d_op].cluster
            cross = a != b
            link_name = None
            if cross and not kind.can_cross_clusters():
                self.err(
                    at + ("channel",),
                    f"{kind.name} cannot cross clusters ({kind.scope} scope), but {s_op} is in "
                    f"cluster {a} and {d_op} in cluster {b}; use wan_flight for KV between datacenters",
                )
                continue
            if kind.scope == "process" and s_op != d_op:
                self.err(
                    at + ("channel",),
                    f"channel local only joins ports inside one process, but {s_op} and {d_op} "
                    "are separate operators; use rdma_tensor, wan_flight or token_ids",
                )
                continue
            if cross:
                link_name = self._edge_link(at, e.link, a, b)
                if link_name is None:
                    continue
            elif e.link is not None:
                self.err(
                    at + ("link",),
                    f"{s_op} and {d_op} are both in cluster {a}; an intra-cluster edge crosses no link",
                )
            params = check_params(
                self.src, at + ("params",), kind.params, e.params, f"channel {kind.name}"
            )
            cid = f"{s_op}.{s_port}->{d_op}.{d_port}"
            if cid in seen:
                self.err(at, f"edge {cid} is declared twice; delete one", key=False)
                continue
            seen.add(cid)
            out.append(
                ChannelPlan(
                    cid,
                    kind.name,
                    str(s_type),
                    s_op,
                    s_port,
                    d_op,
                    d_port,
                    cross,
                    link_name,
                    params,
                )
            )
            self.graph.add(s_op, d_op, cid, kind=kind.name, payload=str(s_type))
        return out

    def _endpoint(self, at: tuple, ref: str, side: str) -> tuple[str, str, Payload] | None:
        if ref.count(".") != 1 or not all(ref.split(".")):
            self.err(at, f"{ref!r} is not `operator.port` (for example `prefill.kv`)")
            return None
        op, port = ref.split(".")
        if op not in self.spec.operators:
            self.err(
                at,
                f"no operator named {op!r}{did_you_mean(op, self.spec.operators)}; operators: "
                f"{', '.join(self.spec.operators)}",
            )
            return None
        optype = self.types.get(op)
        if optype is None:  # its own definition is already reported
            return None
        ports = getattr(optype, side)
        if port not in ports:
            other = optype.inputs if side == "outputs" else optype.outputs
            if port in other:
                where = "an input" if side == "outputs" else "an output"
                self.err(
                    at,
                    f"{op}.{port} is {where} of {optype.name}; edges go from an output to an input",
                )
            else:
                self.err(
                    at,
                    f"{optype.name} operator {op} has no {side[:-1]} port {port!r}"
                    f"{did_you_mean(port, ports)}; its {side}: {', '.join(f'{p} ({t})' for p, t in ports.items())}",
                )
            return None
        return op, port, ports[port]

    def _edge_link(self, at: tuple, declared: str | None, a: str, b: str) -> str | None:
        if declared is not None:
            link = self.links.get(declared)
            if link is None:
                if declared not in self.spec.links:
                    self.err(
                        at + ("link",),
                        f"no link named {declared!r}{did_you_mean(declared, self.spec.links)}",
                    )
                return None
            if not link.connects(a, b):
                self.err(
                    at + ("link",), f"link {declared} joins {link.a} and {link.b}, not {a} and {b}"
                )
                return None
            return declared
        for name, link in self.links.items():
            if link.connects(a, b):
                return name
        self.err(
            at,
            f"this edge crosses from cluster {a} to cluster {b} but no link joins them; add "
            f"`links: {{{a}-{b}: {{gbps: 100, rtt_ms: 30}}}}`",
        )
        return None

    def _unfed_inputs(self, ops: dict[str, OperatorPlan], channels: list[ChannelPlan]) -> None:
        fed = self.declared_inputs
        for name, op in ops.items():
            for port, payload in self.types[name].inputs.items():
                if payload == Payload.KV_BLOCKS and (name, port) not in fed:
                    self.err(
                        ("operators", name),
                        f"{name}.{port} takes {payload} but no edge feeds it; add an edge "
                        f"`{{from: <prefill>.kv, to: {name}.{port}, channel: ...}}` (rdma_tensor inside a cluster, "
                        "wan_flight across clusters)",
                        key=True,
                    )

    def _cycles(self, channels: list[ChannelPlan]) -> None:
        for cycle in self.graph.cycles():
            first = next(
                i for i, e in enumerate(self.spec.edges) if e.from_.split(".")[0] == cycle[0]
            )
            self.err(
                ("edges", first),
                f"edges form a cycle {' -> '.join(cycle + [cycle[0]])}; a pipeline flows one way "
                "(prefill -> relay -> main)",
            )

    def _variants(self, ops: dict[str, OperatorPlan]) -> dict[str, VariantPlan]:
        out = {}
        for name, v in self.spec.variants.items():
            at = ("variants", name)
            missing = [p for p in v.path if p not in self.spec.operators]
            for p in missing:
                i = v.path.index(p)
                self.err(
                    at + ("path", i),
                    f"variant {name}: no operator named {p!r}{did_you_mean(p, self.spec.operators)}",
                )
            if missing or any(p not in ops for p in v.path):
                continue
            if len(set(v.path)) != len(v.path):
                self.err(at + ("path",), f"variant {name} visits an operator twice: {v.path}")
                continue
            first, last = self.types[v.path[0]], self.types[v.path[-1]]
            if not first.entry:
                self.err(
                    at + ("path", 0),
                    f"variant {name} starts at {v.path[0]} ({first.name}), which does not take "
                    f"requests; start at a {' or '.join(t for t in OPERATOR_TYPES.names() if OPERATOR_TYPES.get(t).entry)} operator",
                )
            if not last.decodes:
                self.err(
                    at + ("path", len(v.path) - 1),
                    f"variant {name} ends at {v.path[-1]} ({last.name}), which does "
                    "not decode; a pipeline ends at a decode operator",
                )
            ok = True
            for i, (a, b) in enumerate(zip(v.path, v.path[1:])):
                if not self.declared.has(a, b):
                    ok = False
                    self.err(
                        at + ("path", i + 1),
                        f"variant {name} goes {a} -> {b} but no edge joins them; add an edge "
                        f"from {a} to {b} (for KV: `{{from: {a}.kv, to: {b}.kv, channel: ...}}`)",
                    )
            relays = [p for p in v.path if self.types[p].name == "relay_decode"]
            ends_at_relay = last.name == "relay_decode"
            if ends_at_relay and not v.singular_traffic:
                self.err(
                    at + ("path",),
                    f"variant {name} ends at the relay ({v.path[-1]}): a P-RLD pipeline lets MD's cache "
                    "drift from P's and overloads the relay (PDD.md); end at a main decoder, or mark it "
                    "`singular_traffic: true` if it is the rare long-input, short-output exception",
                )
            if v.singular_traffic and not ends_at_relay:
                self.err(
                    at + ("singular_traffic",),
                    f"variant {name} is marked singular_traffic but does not end at a relay",
                )
            handing_off = bool(relays) and not ends_at_relay
            if handing_off and v.handoff is None:
                self.err(
                    at + ("path",),
                    f"variant {name} passes through relay {relays[0]}; say how it hands off: "
                    "`handoff: one_shot | catch_up | adaptive`",
                )
            if v.handoff is not None and not handing_off:
                self.err(
                    at + ("handoff",),
                    f"variant {name} has no relay handing off to a main decoder, so "
                    f"`handoff: {v.handoff}` has no effect; remove it",
                )
            if handing_off:
                relay = relays[0]
                nxt = v.path[v.path.index(relay) + 1]
                edges = self.declared.between(relay, nxt).values()
                if not any(d["payload"] == str(Payload.TOKEN_IDS) for d in edges):
                    ok = False
                    self.err(
                        at + ("path",),
                        f"variant {name} hands off from {relay} to {nxt} but no TokenIds edge joins "
                        f"them; add `{{from: {relay}.handoff, to: {nxt}.handoff, channel: token_ids}}`",
                    )
            if not ok or not all(self.graph.has(a, b) for a, b in zip(v.path, v.path[1:])):
                continue  # a missing edge is reported above; an invalid one at the edge itself
            chans = tuple(
                c
                for i, a in enumerate(v.path)
                for b in v.path[i + 1 :]
                for c in self._edge_keys(a, b)
            )
            catch_up = ops[relays[0]].params.get("catch_up_tokens", 32) if relays else 32
            out[name] = VariantPlan(
                name,
                tuple(v.path),
                chans,
                v.handoff,
                catch_up,
                v.singular_traffic,
                v.expected_share,
            )
        shares = [
            v.expected_share for v in self.spec.variants.values() if v.expected_share is not None
        ]
        if shares and sum(shares) > 1.0 + 1e-9:
            self.err(
                ("variants",), f"expected_share values add up to {sum(shares):.2f}, more than 1"
            )
        return out

    def _edge_keys(self, a: str, b: str) -> list[str]:
        return list(self.graph.between(a, b))

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

    def _local(self, ops: dict[str, OperatorPlan]) -> dict[str, int]:
        out = {}
        for name, n in self.spec.local.replicas.items():
            if name not in self.spec.operators:
                self.err(
                    ("local", "replicas", name),
                    f"local profile names operator {name!r}, which is not defined"
                    f"{did_you_mean(name, self.spec.operators)}",
                    key=True,
                )
            elif n < 1:
                self.err(("local", "replicas", name), f"local replicas must be >= 1, got {n}")
            else:
                out[name] = n
        return out


def check_params(
    src: Source, at: tuple, declared: dict[str, Param], given: dict[str, Any], owner: str
) -> dict[str, Any]:
    """Every declared parameter with defaults filled in; unknown names and wrong types reported."""
    out = {k: p.default for k, p in declared.items()}
    for key, value in given.items():
        if key not in declared:
            valid = ", ".join(declared) or "none"
            src.error(
                at + (key,),
                f"{owner} has no parameter {key!r}{did_you_mean(str(key), declared)}; "
                f"parameters: {valid}",
                key=True,
            )
            continue
        want = declared[key].type
        ok = isinstance(value, want) and not (want is not bool and isinstance(value, bool))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok:
            src.error(
                at + (key,),
                f"{owner} parameter {key} must be {want.__name__} ({declared[key].help}), got {value!r}",
            )
            continue
        if want in (int, float) and value < 0:
            src.error(at + (key,), f"{owner} parameter {key} must be >= 0, got {value!r}")
            continue
        out[key] = value
    return out
