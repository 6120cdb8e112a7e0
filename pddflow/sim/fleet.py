"""The simulated hardware of one Plan on one clock: every instance's engine and KV store (with its
host-memory tier), the shared links between the clusters, and what the request life measures on
them (the KV a prompt ships, an instance's load as the scheduler reads it). The simulation builds
it; the decode legs and the handoffs are handed it (docs/simulator.md, Model)."""

from __future__ import annotations

import random
from dataclasses import replace

from pddflow.core.kv_reuse import reused_blocks
from pddflow.core.link import jitter_stream, kv_link_seed
from pddflow.graph.plan import OperatorPlan, Plan
from pddflow.scheduler import CacheMirror, InstanceLoad, Topology
from pddflow.sim.calibration.host import HostCpus
from pddflow.sim.calibration.terms import Calibration
from pddflow.sim.engine import SimEngine
from pddflow.sim.events import EventLoop
from pddflow.sim.host_tier import HostTier
from pddflow.sim.kvstore import KVStore
from pddflow.sim.network import SharedLink


class SimFleet:
    """`mirrors`: the scheduler's cache mirrors, which the stores keep in step. `embedded`: the
    engines run one model call at a time, as the embedded runtime's worker loop does.
    `wan_jitter_seed` / `stream_gbps`: see `Simulation`."""

    def __init__(
        self,
        plan: Plan,
        calibration: Calibration,
        mirrors: dict[str, CacheMirror],
        *,
        block_tokens: int,
        seed: int,
        embedded: bool,
        strict_mirrors: bool,
        stream_gbps: float | None,
        wan_jitter_seed: int | None,
    ):
        self.loop = EventLoop()
        self.topo = Topology(plan)
        self.embedded = embedded
        self.block_tokens = block_tokens
        self.kv_bytes_per_token = plan.model.arch.kv_bytes_per_token
        self.page = plan.model.block_size  # KV travels in whole pages, as the runtime's blocks do
        self.links = {
            name: SharedLink(
                self.loop,
                link,
                random.Random(f"{seed}/{name}")
                if wan_jitter_seed is None
                else jitter_stream(kv_link_seed(wan_jitter_seed), 0),
                plan.flow_cap_gbps(name)
                if stream_gbps is None
                else replace(link, stream_gbps=stream_gbps).flow_cap_gbps(plan.streams(name)),
            )
            for name, link in plan.links.items()
        }
        cal = calibration
        self.host = HostCpus(plan, cal.host) if cal.host is not None else None
        self.plan, self.mirrors, self.strict_mirrors = plan, mirrors, strict_mirrors
        self.engines: dict[str, SimEngine] = {}
        self.stores: dict[str, KVStore] = {}
        for inst in plan.instances:
            op = plan.operators[inst.operator]
            model = cal.device_model(
                plan.device_classes[inst.device], inst.devices, plan.model.arch
            )
            eng = SimEngine(self.loop, inst.id, model, op.max_batch, op.chunk_tokens, embedded)
            self.engines[inst.id] = eng
            if self.host is not None:
                self.host.attach(inst.id, eng)
            self.stores[inst.id] = self._store(inst.id)

    def _store(self, iid: str) -> KVStore:
        op = self.plan.operator_of(iid)
        block_bytes = self.kv_bytes_per_token * self.block_tokens
        return KVStore(
            iid,
            int(op.kv_budget_bytes // block_bytes),
            op.caches_prefixes,
            self.mirrors.get(iid),
            self.strict_mirrors,
            self._host_tier(op, block_bytes),
            self._disk_tier(op, block_bytes),
        )

    def fresh_store(self, iid: str) -> None:
        """`iid` restarts (the planner parked it, or starts it again): an empty cache, and so an
        empty mirror."""
        self.stores[iid] = self._store(iid)
        m = self.mirrors.get(iid)
        if m is not None:
            m.reset([])

    def _host_tier(self, op: OperatorPlan, block_bytes: int) -> HostTier | None:
        hc = op.host_cache
        if hc is None or not op.caches_prefixes:
            return None
        blocks = int(hc.bytes // block_bytes)
        if blocks <= 0:
            return None  # declared but none bought (or less than one block)
        return HostTier(blocks, block_bytes / (hc.gbytes_per_s * 1e9), lambda: self.loop.now)

    def _disk_tier(self, op: OperatorPlan, block_bytes: int) -> HostTier | None:
        dc = op.disk_cache
        if dc is None or not op.caches_prefixes or dc.bytes < block_bytes:
            return None
        blocks = int(dc.bytes // block_bytes)
        return HostTier(blocks, block_bytes / (dc.gbytes_per_s * 1e9), lambda: self.loop.now)

    def kv_bytes(self, prompt_tokens: int, hit_blocks: int) -> float:
        """As the runtime: whole pages from the first not reused (see `reused_blocks`)."""
        reused = reused_blocks(hit_blocks, prompt_tokens, self.block_tokens) * self.block_tokens
        end = -(-prompt_tokens // self.page) * self.page
        return float(max(end - reused, 0) * self.kv_bytes_per_token)

    def instance_load(self, iid: str) -> InstanceLoad:
        eng, st = self.engines[iid], self.stores[iid]
        return InstanceLoad(
            len(eng.running),
            eng.queued() + len(st.waiters),
            eng.max_batch,
            st.locked_or_reserved() / max(st.capacity, 1),
            eng.queued_tokens() if eng.jobs else 0,
        )
