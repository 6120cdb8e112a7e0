"""The engine's KV export and import (Engine.export_kv, ship_kv, import_kv): a sequence's blocks
as one KVBlocks with their hashes, every head gathered to the leader or, rank to rank, each rank's
own heads (docs/engine.md, KV across layouts)."""

from __future__ import annotations

from typing import Any

import torch

from pddflow.core.block_hash import partial_block_hash
from pddflow.core.kv_budget import blocks_for
from pddflow.core.payloads import KVBlocks
from pddflow.kernels.kv_copy import gather_blocks, scatter_blocks
from pddflow.operators.sequence import Sequence
from pddflow.operators.tp_steps import (
    ShardStep,
    export_blocks,
    import_blocks,
    land_blocks,
    ship_blocks,
)

Engine = Any  # operators.engine.Engine, whose methods call these (importing it would loop)


class KVShardMissing(RuntimeError):
    """A rank of this instance lacks its heads of the KV being landed (not arrived yet, or lost):
    nothing landed on any rank."""


def _range(engine: Engine, seq: Sequence, start_block: int, end_block: int | None):
    """(block ids, block hashes, token_start, token_end) of blocks [start_block, end_block)."""
    bs = engine.block_size
    n_blocks = blocks_for(seq.num_computed, bs)
    end_block = n_blocks if end_block is None else min(end_block, n_blocks)
    if not 0 <= start_block <= end_block:
        raise ValueError(
            f"bad block range [{start_block}, {end_block}) for {n_blocks} computed blocks"
        )
    token_start, token_end = start_block * bs, min(seq.num_computed, end_block * bs)
    full = seq.block_hashes(bs, seq.num_computed)
    hashes = full[start_block:end_block]
    if end_block > len(full) and end_block > start_block:
        parent = full[-1] if full else None
        hashes.append(partial_block_hash(seq.token_ids[len(full) * bs : token_end], parent))
    return seq.block_table[start_block:end_block], hashes, token_start, token_end


def export_kv(engine: Engine, seq: Sequence, start_block: int, end_block: int | None) -> KVBlocks:
    blocks, hashes, token_start, token_end = _range(engine, seq, start_block, end_block)
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
    blocks, hashes, token_start, token_end = _range(engine, seq, start_block, None)
    step = ShardStep(seq.seq_id, token_start, blocks, token_end, hashes, route)
    return ship_blocks(tp, engine.pool.tensor, step, engine.block_size, engine.kv_heads)


def import_kv(engine: Engine, seq: Sequence, kv: KVBlocks, cache: bool) -> None:
    bs = engine.block_size
    if kv.block_size != bs:
        raise ValueError(f"KV block size {kv.block_size} != engine block size {bs}")
    if kv.token_start != seq.num_computed or kv.token_start % bs:
        raise ValueError(
            f"KV starts at token {kv.token_start} but {seq.seq_id} has {seq.num_computed} "
            "computed tokens"
        )
    if kv.token_end > len(seq.token_ids):
        raise ValueError(
            f"KV covers tokens up to {kv.token_end}, the sequence knows {len(seq.token_ids)}"
        )
    want = blocks_for(kv.token_end, bs) - kv.token_start // bs
    if kv.num_blocks != want or (want and kv.data.shape[0] != want):
        raise ValueError(
            f"KV range [{kv.token_start}, {kv.token_end}) needs {want} blocks, got {kv.num_blocks}"
        )
    ours = seq.block_hashes(bs, kv.token_end)[kv.token_start // bs :]
    if list(kv.block_hashes[: len(ours)]) != ours:
        raise ValueError(
            f"received KV blocks do not match the prefix of {seq.seq_id} (block hash mismatch)"
        )
    if kv.heads is not None and kv.heads != engine.kv_heads:
        raise ValueError(
            f"KV of heads {list(kv.heads)} sent to the rank holding heads {list(engine.kv_heads)}"
        )
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
    seq.block_table += blocks
    seq.num_computed = kv.token_end
    if cache and engine.config.prefix_cache:
        engine.cache_sequence(seq)
