"""The engine's KV export and import (Engine.export_kv, ship_kv, import_kv): a sequence's blocks
as one KVBlocks with their hashes, every head gathered to the leader or, rank to rank, each rank's
own heads (docs/engine.md, KV across layouts)."""

from __future__ import annotations

from typing import Any

import torch

from pddflow.core.payloads import KVBlocks
from pddflow.kernels.kv_copy import gather_blocks, scatter_blocks
from pddflow.operators.engine_core import KVShardMissing
from pddflow.operators.sequence import Sequence
from pddflow.operators.tp_steps import (
    ShardStep,
    export_blocks,
    import_blocks,
    land_blocks,
    ship_blocks,
)

Engine = Any  # operators.engine.Engine, whose methods call these (importing it would loop)


def export_kv(engine: Engine, seq: Sequence, start_block: int, end_block: int | None) -> KVBlocks:
    blocks, hashes, token_start, token_end = engine.kv_range(seq, start_block, end_block)
    pool = engine.pool.tensor
    tp = engine._leads()
    if tp is None:
        data = gather_blocks(pool, blocks)
    elif blocks:
        assert engine._shard is not None
        data = export_blocks(tp, engine._shard, pool, blocks)
    else:
        data = pool.new_empty((0, *engine._block_shape()))
    return KVBlocks(seq.seq_id, hashes, token_start, token_end, engine.block_size, data)


def ship_kv(engine: Engine, seq: Sequence, route: bytes, start_block: int) -> KVBlocks:
    tp = engine._leads()
    if tp is None:  # one rank holds every head: the plain export, marked as such
        kv = export_kv(engine, seq, start_block, None)
        kv.heads = engine.kv_heads
        return kv
    blocks, hashes, token_start, token_end = engine.kv_range(seq, start_block, None)
    step = ShardStep(seq.seq_id, token_start, blocks, token_end, hashes, route)
    return ship_blocks(tp, engine.pool.tensor, step, engine.block_size, engine.kv_heads)


def import_kv(engine: Engine, seq: Sequence, kv: KVBlocks, cache: bool) -> None:
    want = engine.check_import(seq, kv)
    if want == 0:
        return
    data = kv.data if isinstance(kv.data, torch.Tensor) else torch.from_numpy(kv.data)
    shape = engine._block_shape(kv.heads[1] - kv.heads[0] if kv.heads else None)
    if tuple(data.shape) != (want, *shape):
        raise ValueError(
            f"KV data of shape {tuple(data.shape)} does not fit {want} blocks of shape {shape}"
        )
    tp = engine._leads()
    pool = engine.pool.tensor
    blocks = engine._allocate(want, f"importing {want} blocks")
    if tp is None:
        scatter_blocks(pool, blocks, data)
    elif kv.heads is None:
        assert engine._shard is not None
        import_blocks(tp, engine._shard, pool, blocks, data)
    elif not land_blocks(tp, pool, ShardStep(seq.seq_id, kv.token_start, blocks), data):
        engine.allocator.decref(blocks)
        raise KVShardMissing(
            f"a rank of this instance lacks its heads of {seq.seq_id}'s KV from token "
            f"{kv.token_start}"
        )
    engine.landed(seq, kv, blocks, cache)
