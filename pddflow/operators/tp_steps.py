"""The step protocol between a tensor-parallel leader and its followers (docs/engine.md, Tensor
parallelism): what one forward needs, packed into int64 tensors (no pickle), and the KV blocks a
transfer moves, gathered to / scattered from the leader in the canonical full-head layout.

Every message is a header [kind, length] and an int64 payload, broadcast from the leader:
FORWARD (a `ForwardBatch`), EXPORT and IMPORT (block ids; the KV itself moves by gather / scatter
after it), STOP (leave `follow`). Followers mirror the leader in message order, so their pools hold
the same blocks at the same ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pddflow.kernels.kv_copy import gather_blocks, scatter_blocks
from pddflow.kernels.paged_attention import SeqSpan
from pddflow.operators.tensor_parallel import STOP, Shard, TPGroup

FORWARD, EXPORT, IMPORT = 1, 2, 3


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


def follow(tp: TPGroup, pool: torch.Tensor, forward: Callable[[ForwardBatch], None]) -> None:
    """A follower's loop: mirror the leader's messages until STOP (return) or a lost peer
    (TPPeerLost)."""
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
        else:
            raise RuntimeError(f"unknown tensor-parallel step kind {kind}")
