"""The engine: the model on a paged KV pool, under the entry points every engine shares
(engine_core.py; docs/engine.md, What the runtime calls). No scheduler lives here: the runtime's
workers decide what runs when, and `generate` hands the colocated reference to
continuous_batching.py."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import replace

import torch

from pddflow.core.kv_budget import blocks_for
from pddflow.core.payloads import KVBlocks
from pddflow.kernels.paged_attention import Numerics, calibrate, plan_attention
from pddflow.operators import kv_exchange, kv_tiers
from pddflow.operators.block_allocator import KVCacheFull
from pddflow.operators.cache_state import NO_LOAD, TierLoad
from pddflow.operators.engine_config import EngineConfig, prepare
from pddflow.operators.engine_core import EngineCore, KVShardMissing
from pddflow.operators.grammar import Grammars
from pddflow.operators.kv_cache import KVPool, block_bytes, blocks_for_budget
from pddflow.operators.kv_tiers import KVTiers
from pddflow.operators.model import LlamaModel
from pddflow.operators.sampling import sample_sequences
from pddflow.operators.sequence import Sequence
from pddflow.operators.tensor_parallel import Shard, TPGroup, TPPeerLost
from pddflow.operators.tp_steps import FORWARD, ForwardBatch, RankKV, follow_steps
from pddflow.operators.weights import ModelSource, load_model_source

__all__ = ["Engine", "EngineConfig", "KVCacheFull", "KVShardMissing", "TPPeerLost"]


class Engine(EngineCore):
    """`tp`: this process's rank of a tensor-parallel instance (tensor_parallel.join). The leader
    (rank 0, and every TP 1 engine) owns the allocator, radix cache, sequences and sampling and
    runs every entry point; a follower holds its shard of the weights and of the KV pool (the
    leader's block ids) and mirrors the leader's steps in `follow()`."""

    def __init__(
        self, source: ModelSource, config: EngineConfig = EngineConfig(), tp: TPGroup | None = None
    ):
        self.source = source
        self.tokenizer = source.tokenizer
        self._grammars: Grammars | None = None
        self._tp = tp
        self._closed = False
        self.device, self.dtype = prepare(config, tp.device if tp else None, tp.size if tp else 1)
        bs = config.block_size
        mc = source.config
        self._shard = (
            Shard.of(mc, tp.size, tp.rank, config.expert_parallel) if tp is not None else None
        )
        local = self._shard.local if self._shard is not None else mc
        max_rows = max(config.chunk_size, config.max_decode_rows)
        self.model = LlamaModel(
            mc,
            source.weights,
            self.device,
            self.dtype,
            max_rows,
            self._shard,
            tp.sum_partials if tp is not None else None,
        )
        # the pool's capacity and a block's bytes are the whole model's, at any TP degree
        num_blocks = blocks_for_budget(mc, bs, self.dtype, config.kv_cache_bytes)
        super().__init__(config, mc, num_blocks, block_bytes(mc, bs, self.dtype), max_rows)
        self.pool = KVPool(local, num_blocks, bs, self.dtype, self.device)
        self.tiers: KVTiers | None = kv_tiers.for_engine(config, source, self.pool.tensor, tp)
        self.numerics = (
            calibrate(
                local.head_dim,
                local.num_kv_heads,
                local.group_size,
                config.attention_tile,
                torch.get_num_threads(),
                local.kv_planes,
                local.value_dim,
            )
            if self.device.type == "cpu"
            else Numerics(1, True, False)
        )
        if tp is not None:
            self._handshake(num_blocks)
            self.source = replace(source, weights={})  # the shards are all a rank keeps

    def _handshake(self, num_blocks: int) -> None:
        """Every rank loaded the same model with the same settings (else ValueError on all)."""
        assert self._tp is not None
        c, cfg = self.model_config, self.config
        self._tp.check_same(
            {
                "layers": c.num_layers,
                "hidden": c.hidden_size,
                "heads": c.num_heads,
                "KV heads": c.num_kv_heads,
                "head dim": c.head_dim,
                "intermediate": c.intermediate_size,
                "experts": c.num_experts,
                "expert parallel": int(cfg.expert_parallel and c.num_experts > 0),
                "expert intermediate": c.moe_intermediate_size,
                "vocab": c.vocab_size,
                "KV blocks": num_blocks,
                "block size": cfg.block_size,
                "chunk size": cfg.chunk_size,
                "decode rows": cfg.max_decode_rows,
                "attention tile": cfg.attention_tile,
                "dtype bytes": self.pool.tensor.element_size(),
            }
        )

    @property
    def is_leader(self) -> bool:
        """True at TP 1 and on rank 0: the rank the runtime drives."""
        return self._tp is None or self._tp.is_leader

    def follow(self, rank_kv: RankKV | None = None) -> None:
        """Rank > 0: run the leader's steps until it closes (returns) or a rank is lost
        (TPPeerLost); rank_kv sends and supplies this rank's heads of rank-to-rank KV."""
        if self.is_leader or self._tp is None:
            raise RuntimeError("follow() is for tensor-parallel ranks > 0; the leader drives steps")
        follow_steps(
            self._tp,
            self.pool.tensor,
            lambda batch: self._run(batch, logits=False),
            rank_kv,
            self.block_size,
            self.kv_heads,
        )

    def close(self) -> None:
        """Leader: tell the followers to stop (their follow() returns); idempotent; a no-op at TP
        1 and on followers. The group itself is closed by whoever joined it."""
        super().close()
        if self._tp is None or not self._tp.is_leader or self._closed:
            return
        self._closed = True
        try:
            self._tp.stop_followers()
        except TPPeerLost:
            pass  # they are gone already

    def _leads(self) -> TPGroup | None:
        """The group when this engine leads one; raises on a follower or after close()."""
        if self._tp is None:
            return None
        if not self._tp.is_leader:
            raise RuntimeError(f"rank {self._tp.rank} follows the leader's steps: call follow()")
        if self._closed:
            raise RuntimeError("this tensor-parallel engine is closed")
        return self._tp

    @classmethod
    def from_spec(
        cls, spec: str, config: EngineConfig = EngineConfig(), tp: TPGroup | None = None
    ) -> Engine:
        return cls(load_model_source(spec), config, tp)

    def load_lower(self, seq: Sequence, blocks: int) -> TierLoad:
        """Extend the sequence's cached prefix, up to its first `blocks` blocks, with the run of
        blocks the tiers below the device hold (kv_tiers.load_run)."""
        return kv_tiers.load_run(self, seq, blocks) if self.tiers is not None else NO_LOAD

    def score(self, token_ids: Seq[int]) -> torch.Tensor:
        """Teacher-forced logits [n, V] (no cache reuse, nothing kept)."""
        seq = self.add_sequence(token_ids)
        try:
            rows: list[torch.Tensor] = []
            while seq.num_pending:
                end = min(len(seq.token_ids), seq.num_computed + self.config.chunk_size)
                rows.append(self._forward([(seq, seq.num_computed, end)], all_rows=True))
            return torch.cat(rows)
        finally:
            self.allocator.decref(seq.block_table)
            seq.block_table = []

    def export_kv(
        self, seq: Sequence, start_block: int = 0, end_block: int | None = None
    ) -> KVBlocks:
        """Blocks [start_block, end_block) as one KVBlocks (the last may be partial), every head."""
        return kv_exchange.export_kv(self, seq, start_block, end_block)

    def ship_kv(self, seq: Sequence, route: bytes, start_block: int = 0) -> KVBlocks:
        """Rank to rank: every rank of the instance sends its own KV heads of blocks [start_block,
        ...) by `route` (its runtime's RankKV); the leader's own heads, for the leader to send."""
        return kv_exchange.ship_kv(self, seq, route, start_block)

    def import_kv(self, seq: Sequence, kv: KVBlocks, cache: bool = True) -> None:
        """Land received KV in fresh blocks; full blocks are checked against `seq`'s own hashes.
        KV of this rank's heads alone (`kv.heads`): every rank lands its own, or none does
        (KVShardMissing)."""
        kv_exchange.import_kv(self, seq, kv, cache)

    @property
    def kv_heads(self) -> tuple[int, int]:
        """The model's KV heads [a, b) this rank holds."""
        if self._shard is None:
            return 0, self.model_config.num_kv_heads
        return self._shard.k0, self._shard.k1

    def _block_shape(self, heads: int | None = None) -> tuple[int, ...]:
        """One block of the whole model (or of `heads` KV heads): [layers, planes, block_size,
        num_kv_heads, head_dim]."""
        c = self.model_config
        return (c.num_layers, c.kv_planes, self.block_size, heads or c.num_kv_heads, c.head_dim)

    def _forward(
        self, items: list[tuple[Sequence, int, int]], all_rows: bool = False
    ) -> torch.Tensor:
        """KV of tokens [start, end) of each sequence; fp32 logits of each item's last row (or of
        every row). At TP > 1 the followers run the same batch."""
        tp = self._leads()
        for seq, _, end in items:
            self._ensure_blocks(seq, end)
        bs = self.block_size
        batch = ForwardBatch(
            [t for seq, start, end in items for t in seq.token_ids[start:end]],
            [start for _, start, _ in items],
            [end for _, _, end in items],
            [seq.block_table[: blocks_for(end, bs)] for seq, _, end in items],
            all_rows,
        )
        if tp is not None:
            tp.send(FORWARD, batch.pack())
        logits = self._run(batch)
        assert logits is not None
        for seq, _, end in items:
            seq.num_computed = end
        return logits

    def _run(self, batch: ForwardBatch, logits: bool = True) -> torch.Tensor | None:
        bs, dev = self.block_size, self.device
        pos, slot_blocks, spans, last_rows = batch.inputs(bs)
        plan = plan_attention(
            spans,
            block_size=bs,
            num_layers=self.model.config.num_layers,
            num_kv_heads=self.model.config.num_kv_heads,
            group_size=self.model.config.group_size,
            device=dev,
            tile=self.config.attention_tile,
            row_multiple=self.numerics.row_multiple,
            decode_kt_view=self.numerics.decode_kt_view,
            kv_planes=self.model.config.kv_planes,
            value_dim=self.model.config.value_dim,
        )
        rows = None
        if logits:
            rows = torch.arange(len(pos)) if batch.all_rows else torch.tensor(last_rows)
            rows = rows.to(dev)
        positions = torch.tensor(pos, dtype=torch.long)
        with torch.inference_mode():
            return self.model.forward(
                torch.tensor(batch.token_ids, dtype=torch.long, device=dev),
                positions.to(dev),
                torch.tensor(slot_blocks, dtype=torch.long, device=dev),
                (positions % bs).to(dev),
                plan,
                self.pool,
                rows,
            )

    def _sample_rows(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        # the grammar engine reads the tokenizer only once a request asks for structured output
        constrained = any(s.sampling.grammar for s in seqs)
        return sample_sequences(seqs, logits, self.grammars if constrained else None)

    @property
    def grammars(self) -> Grammars | None:
        """Structured output's grammars (built on first use; None without a tokenizer)."""
        if self._grammars is None and self.tokenizer is not None:
            self._grammars = Grammars(self.tokenizer, self.model_config.vocab_size)
        return self._grammars
