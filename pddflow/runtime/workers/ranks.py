"""The engine of one rank process of an instance. Every rank builds it the same way (its shard of
the weights and of the KV pool); the leader (rank 0) runs the worker's loop over it, the others
follow the leader's steps until it stops or a rank is lost."""

from __future__ import annotations

from pddflow.graph.plan import OperatorPlan, rank_name
from pddflow.runtime.wiring import Wiring


def build_engine(wiring: Wiring, instance: str, rank: int):
    """The engine of rank `rank` of `instance`, joined to its ranks' group when it has several."""
    if wiring.engine == "modeled":
        return modeled_engine(wiring, instance)
    import torch

    from pddflow.operators.engine import Engine, EngineConfig
    from pddflow.operators.engine_config import rank_device
    from pddflow.operators.tensor_parallel import TPConfig, join

    plan = wiring.plan()
    op = plan.operator_of(instance)
    config = EngineConfig(
        block_size=plan.model.block_size,
        chunk_size=op.chunk_tokens,
        prefix_cache=op.caches_prefixes,
        num_threads=wiring.threads.get(rank_name(instance, rank)) or None,  # its share of the host
        expert_parallel=op.expert_parallel,
        **cache_sizes(wiring, op, instance),
    )
    tp = TPConfig(op.ranks, rank, wiring.workers[instance].tp_init, wiring.tp_timeout_s)
    device = torch.device(rank_device(rank, config.device))
    group = join(tp, device) if op.ranks > 1 else None
    return Engine.from_spec(plan.model.weights, config, tp=group)


def modeled_engine(wiring: Wiring, instance: str):
    """One process standing for the whole replica: its time from the device model of the
    operator's device class and devices per replica, its pool the replica's KV budget."""
    from pddflow.core.device_model import DeviceModel
    from pddflow.operators.engine_config import EngineConfig
    from pddflow.operators.modeled_engine import ModeledEngine
    from pddflow.operators.weights import model_config_of

    plan = wiring.plan()
    op = plan.operator_of(instance)
    arch, bs = plan.model.arch, plan.model.block_size
    config = EngineConfig(
        block_size=bs,
        chunk_size=op.chunk_tokens,
        max_decode_rows=max(op.max_batch, 1),
        prefix_cache=op.caches_prefixes,
        kv_cache_bytes=int(op.kv_budget_bytes),
    )
    step = DeviceModel(plan.device_classes[op.device], op.devices_per_replica, arch)
    return ModeledEngine(
        config,
        model_config_of(plan.model.weights),
        step,
        int(arch.kv_bytes_per_token * bs),
        wiring.kv_scale,
        wiring.time_scale,
    )


def cache_sizes(wiring: Wiring, op: OperatorPlan, instance: str) -> dict:
    """The instance's KV pool (in whole-model bytes) and the tiers under it, as the local profile
    sizes them (Plan.scaled_to_local). Tiers sit under a single-rank engine only: a
    tensor-parallel one deploys none."""
    local = wiring.plan().local_cache_mib.get(op.name)
    sizes = {
        "kv_cache_bytes": int(op.kv_budget_bytes) if local and local.kv else wiring.kv_cache_bytes
    }
    host, disk = op.host_cache, op.disk_cache
    if op.ranks > 1:
        if host or disk:
            print(f"{instance}: KV tiers are not deployed under a tensor-parallel instance")
        return sizes
    if host is not None and host.gib > 0:
        sizes["host_cache_bytes"] = int(host.bytes)
    if disk is not None:
        sizes["disk_cache_bytes"] = int(disk.bytes)
        sizes["disk_cache_dir"] = str(wiring.disk_cache_dir(op, instance))
        sizes["disk_cache_persist"] = disk.persist
    return sizes


def run_follower(wiring: Wiring, instance: str, rank: int) -> int:
    """A deployed follower rank: every follower's life (operators/follower.py `follow_leader`)
    over the engine the wiring describes, with its part of rank-to-rank KV."""
    from pddflow.operators.follower import follow_leader
    from pddflow.runtime.workers.rank_kv import FollowerKV

    return follow_leader(
        rank_name(instance, rank),
        lambda: build_engine(wiring, instance, rank),
        lambda engine: FollowerKV(wiring, instance, rank, engine),
    )
