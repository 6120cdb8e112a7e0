"""The step protocol between a tensor-parallel leader and its followers (docs/engine.md, Tensor
parallelism): what one forward needs, packed into int64 tensors (no pickle), and the KV blocks a
transfer moves, gathered to / scattered from the leader in the canonical full-head layout.

Every message is a header [kind, length] and an int64 payload, broadcast from the leader:
FORWARD (a `ForwardBatch`), EXPORT and IMPORT (block ids; the KV itself moves by gather / scatter
after it), SHIP and LAND (rank-to-rank KV: a `ShardStep`; each rank's runtime sends or supplies its
own heads, `RankKV`), STOP (leave `follow_steps`). Followers mirror the leader in message order, so
their pools hold the same blocks at the same ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from pddflow.core.payloads import KVBlocks
from pddflow.kernels.kv_copy import gather_blocks, scatter_blocks
from pddflow.kernels.paged_attention import SeqSpan
from pddflow.operators.tensor_parallel import STOP, Shard, TPGroup

FORWARD, EXPORT, IMPORT, SHIP, LAND = 1, 2, 3, 4, 5


class RankKV(Protocol):
    """What a rank's runtime does for rank-to-rank KV (the engine moves no bytes off the host)."""

    def ship(self, kv: KVBlocks, route: bytes) -> None:
        """Send this rank's heads of `kv` where `route` (the leader runtime's words) says."""

    def take(self, seq_id: str, token_start: int) -> torch.Tensor | None:
        """This rank's heads of seq_id's KV from token_start, once every piece has arrived."""

    def close(self) -> None:
        """Stop its receivers and senders (the rank's follow has ended)."""


def _pack_bytes(b: bytes) -> list[int]:
    padded = b + bytes(-len(b) % 8)
    return [len(b), *np.frombuffer(padded, dtype="<i8").tolist()]


def _unpack_bytes(v: list[int], at: int) -> tuple[bytes, int]:
    n = v[at]
    words = (n + 7) // 8
    raw = np.array(v[at + 1 : at + 1 + words], dtype="<i8").tobytes()[:n]
    return raw, at + 1 + words


@dataclass
class ShardStep:
    """SHIP: every rank sends its heads of `blocks`, the KV of seq_id's tokens [token_start,
    token_end) with `hashes`, by `route`. LAND: every rank lands its heads of seq_id's KV from
    token_start in `blocks`, if all ranks have theirs (hashes, token_end, route unused)."""

    seq_id: str
    token_start: int
    blocks: list[int]
    token_end: int = 0
    hashes: list[int] | None = None
    route: bytes = b""

    def pack(self) -> torch.Tensor:
        # block hashes are unsigned 64-bit: their bits travel as int64
        hashes = np.array(self.hashes or [], dtype=np.uint64).view(np.int64).tolist()
        flat = [self.token_start, self.token_end, len(self.blocks), *self.blocks, len(hashes)]
        flat += hashes
        flat += _pack_bytes(self.seq_id.encode()) + _pack_bytes(self.route)
        return torch.tensor(flat, dtype=torch.long)

    @classmethod
    def unpack(cls, packed: torch.Tensor) -> ShardStep:
        v = packed.tolist()
        start, end, n = v[0], v[1], v[2]
        blocks = v[3 : 3 + n]
        at = 3 + n
        hashes = np.array(v[at + 1 : at + 1 + v[at]], dtype=np.int64).view(np.uint64).tolist()
        at += 1 + v[at]
        seq, at = _unpack_bytes(v, at)
        route, _ = _unpack_bytes(v, at)
        return cls(seq.decode(), start, blocks, end, hashes, route)


@dataclass
class ForwardBatch:
    """One forward: item i computes tokens [starts[i], ends[i]) of a sequence whose block table
    (its first blocks_for(ends[i]) blocks) is tables[i]; token_ids are those tokens, items
    concatenated. all_rows: logits of every row (score), else of each item's last row."""

    token_ids: list[int]
    starts: list[int]
    ends: list[int]
    tables: list[list[int]]
    all_rows: bool = False

    def pack(self) -> torch.Tensor:
        n = len(self.starts)
        flat = [n, int(self.all_rows), *self.starts, *self.ends, *(len(t) for t in self.tables)]
        flat += self.token_ids
        for t in self.tables:
            flat += t
        return torch.tensor(flat, dtype=torch.long)

    @classmethod
    def unpack(cls, packed: torch.Tensor) -> ForwardBatch:
        v = packed.tolist()
        n, all_rows = v[0], bool(v[1])
        starts, ends, lens = v[2 : 2 + n], v[2 + n : 2 + 2 * n], v[2 + 2 * n : 2 + 3 * n]
        at = 2 + 3 * n
        ntok = sum(e - s for s, e in zip(starts, ends))
        token_ids = v[at : at + ntok]
        at += ntok
        tables = []
        for k in lens:
            tables.append(v[at : at + k])
            at += k
        return cls(token_ids, starts, ends, tables, all_rows)

    def inputs(self, block_size: int):
        """(positions, slot blocks, attention spans, last row of each item)."""
        pos: list[int] = []
        slot_blocks: list[int] = []
        spans: list[SeqSpan] = []
        last_rows: list[int] = []
        for start, end, table in zip(self.starts, self.ends, self.tables):
            spans.append(SeqSpan(len(pos), end - start, start, table))
            rng = range(start, end)
            pos += rng
            slot_blocks += [table[p // block_size] for p in rng]
            last_rows.append(len(pos) - 1)
        return pos, slot_blocks, spans, last_rows


def export_blocks(tp: TPGroup, shard: Shard, pool: torch.Tensor, blocks: list[int]) -> torch.Tensor:
    """Leader: the full-head KV of `blocks`, [n, L, 2, bs, num_kv_heads, D], from every rank."""
    tp.send(EXPORT, torch.tensor(blocks, dtype=torch.long))
    parts = tp.gather_to_leader(gather_blocks(pool, blocks))
    assert parts is not None
    return shard.canonical(parts)


def import_blocks(
    tp: TPGroup, shard: Shard, pool: torch.Tensor, blocks: list[int], data: torch.Tensor
) -> None:
    """Leader: land full-head KV `data` in `blocks` of every rank, each keeping its KV heads."""
    data = data.to(device=pool.device, dtype=pool.dtype)
    parts = shard.split(data)
    tp.send(IMPORT, torch.tensor(blocks, dtype=torch.long))
    local = torch.empty_like(parts[0])
    tp.scatter_from_leader(parts, local)
    scatter_blocks(pool, blocks, local)


def ship_blocks(
    tp: TPGroup, pool: torch.Tensor, step: ShardStep, block_size: int, heads: tuple[int, int]
) -> KVBlocks:
    """Leader: every rank sends its heads of `step.blocks` by `step.route`; the leader's own."""
    tp.send(SHIP, step.pack())
    return _shard_kv(pool, step, block_size, heads)


def land_blocks(tp: TPGroup, pool: torch.Tensor, step: ShardStep, data: torch.Tensor) -> bool:
    """Leader: land `data` (its own heads) in `step.blocks`, and every follower its heads, if all
    ranks have them; False (nothing landed anywhere) when one lacks its shard."""
    tp.send(LAND, step.pack())
    if not tp.all_true(True):
        return False
    scatter_blocks(pool, step.blocks, data.to(device=pool.device, dtype=pool.dtype))
    return True


def _shard_kv(pool: torch.Tensor, step: ShardStep, block_size: int, heads) -> KVBlocks:
    data = gather_blocks(pool, step.blocks)
    return KVBlocks(
        step.seq_id,
        list(step.hashes or []),
        step.token_start,
        step.token_end,
        block_size,
        data,
        heads,
    )


def _land_shard(tp: TPGroup, pool: torch.Tensor, step: ShardStep, rank_kv: RankKV | None) -> None:
    data = rank_kv.take(step.seq_id, step.token_start) if rank_kv is not None else None
    fits = data is not None and tuple(data.shape) == (len(step.blocks), *pool.shape[1:])
    if tp.all_true(fits):
        assert data is not None
        scatter_blocks(pool, step.blocks, data.to(device=pool.device, dtype=pool.dtype))


def follow_steps(
    tp: TPGroup,
    pool: torch.Tensor,
    forward: Callable[[ForwardBatch], None],
    rank_kv: RankKV | None = None,
    block_size: int = 0,
    heads: tuple[int, int] = (0, 0),
) -> None:
    """A follower's loop: mirror the leader's messages until STOP (return) or a lost peer
    (TPPeerLost). rank_kv sends and supplies this rank's heads of rank-to-rank KV."""
    while True:
        kind, payload = tp.recv()
        if kind == STOP:
            return
        if kind == FORWARD:
            forward(ForwardBatch.unpack(payload))
        elif kind == EXPORT:
            tp.gather_to_leader(gather_blocks(pool, payload.tolist()))
        elif kind == IMPORT:
            blocks = payload.tolist()
            local = torch.empty(len(blocks), *pool.shape[1:], dtype=pool.dtype, device=pool.device)
            tp.scatter_from_leader(None, local)
            scatter_blocks(pool, blocks, local)
        elif kind == SHIP:
            step = ShardStep.unpack(payload)
            if rank_kv is not None:
                rank_kv.ship(_shard_kv(pool, step, block_size, heads), step.route)
        elif kind == LAND:
            _land_shard(tp, pool, ShardStep.unpack(payload), rank_kv)
        else:
            raise RuntimeError(f"unknown tensor-parallel step kind {kind}")
