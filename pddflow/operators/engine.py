"""The engine: a model, a paged KV pool, a radix prefix cache and the entry points the runtime
calls (docs/engine.md, What the runtime calls). No scheduler lives here: the runtime's workers
decide what runs when, and `generate` hands the colocated reference to continuous_batching.py."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import replace

import torch

from pddflow.core.kv_budget import blocks_for
from pddflow.core.model_config import ModelConfig
from pddflow.core.payloads import KVBlocks, Request, SamplingParams
from pddflow.kernels.paged_attention import Numerics, calibrate, plan_attention
from pddflow.operators import continuous_batching, kv_exchange, kv_tiers
from pddflow.operators.block_allocator import BlockAllocator, KVCacheFull
from pddflow.operators.engine_config import EngineConfig, prepare
from pddflow.operators.grammar import Grammars
from pddflow.operators.kv_cache import KVPool, block_bytes, blocks_for_budget
from pddflow.operators.kv_exchange import KVShardMissing
from pddflow.operators.kv_tiers import NO_LOAD, KVTiers, TierLoad
from pddflow.operators.model import LlamaModel
from pddflow.operators.radix_cache import RadixCache
from pddflow.operators.sampling import sample_sequences
from pddflow.operators.sequence import Sequence
from pddflow.operators.tensor_parallel import Shard, TPGroup, TPPeerLost
from pddflow.operators.tp_steps import FORWARD, ForwardBatch, RankKV, follow
from pddflow.operators.weights import ModelSource, load_model_source

__all__ = ["Engine", "EngineConfig", "KVCacheFull", "KVShardMissing", "TPPeerLost"]


class Engine:
    """`tp`: this process's rank of a tensor-parallel instance (tensor_parallel.join). The leader
    (rank 0, and every TP 1 engine) owns the allocator, radix cache, sequences and sampling and
    runs every entry point; a follower holds its shard of the weights and of the KV pool (the
    leader's block ids) and mirrors the leader's steps in `follow()`."""

    def __init__(
        self, source: ModelSource, config: EngineConfig = EngineConfig(), tp: TPGroup | None = None
    ):
        self.config = config
        self.source = source
        self.model_config: ModelConfig = source.config
        self.tokenizer = source.tokenizer
        self._grammars: Grammars | None = None
        self._tp = tp
        self._closed = False
        self.device, self.dtype = prepare(config, tp.device if tp else None, tp.size if tp else 1)
        bs = config.block_size
        mc = self.model_config
        self._shard = (
            Shard.of(mc, tp.size, tp.rank, config.expert_parallel) if tp is not None else None
        )
        local = self._shard.local if self._shard is not None else mc
        self._max_rows = max(config.chunk_size, config.max_decode_rows)
        self.model = LlamaModel(
            mc,
            source.weights,
            self.device,
            self.dtype,
            self._max_rows,
            self._shard,
            tp.sum_partials if tp is not None else None,
        )
        # the pool's capacity and a block's bytes are the whole model's, at any TP degree
        num_blocks = blocks_for_budget(mc, bs, self.dtype, config.kv_cache_bytes)
        self.block_bytes = block_bytes(mc, bs, self.dtype)
        if num_blocks < 1:
            raise KVCacheFull(1, 0, 0, self.block_bytes, "a single block")
        self.pool = KVPool(local, num_blocks, bs, self.dtype, self.device)
        self.allocator = BlockAllocator(num_blocks)
        self.radix = RadixCache(
            on_evict=self._evicted, evictable=lambda b: self.allocator.refcount(b) == 1
        )
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
        self._ids = itertools.count()
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
        follow(
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
        if self.tiers is not None:
            self.tiers.close(remove_disk=not self.config.disk_cache_persist)
            self.tiers = None
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

    @property
    def max_step_tokens(self) -> int:
        """Most tokens one forward takes (its buffers are sized for them)."""
        return self._max_rows

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def add_sequence(
        self,
        prompt_ids: Seq[int],
        sampling: SamplingParams = SamplingParams(),
        seq_id: str | None = None,
    ) -> Sequence:
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("empty prompt")
        bad = [t for t in ids if not 0 <= t < self.model_config.vocab_size]
        if bad:
            raise ValueError(
                f"token ids {bad[:5]} are outside the vocabulary "
                f"[0, {self.model_config.vocab_size})"
            )
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(63)
        return Sequence(seq_id or f"seq-{next(self._ids)}", ids, len(ids), sampling, seed)

    def append_tokens(self, seq: Sequence, token_ids: Seq[int]) -> None:
        """Known tokens whose KV is not computed yet."""
        seq.token_ids.extend(int(t) for t in token_ids)

    def reuse_prefix(self, seq: Sequence, keep_last: bool = True) -> int:
        """Adopt the longest cached prefix of a fresh sequence; returns the tokens reused. keep_last
        leaves one token to compute: prefill needs logits at the last position."""
        if seq.block_table or seq.num_computed or not self.config.prefix_cache:
            return 0
        bs = self.block_size
        limit = (len(seq.token_ids) - 1) // bs if keep_last else len(seq.token_ids) // bs
        self.adopt_cached(seq, limit)
        return seq.num_computed

    def adopt_cached(self, seq: Sequence, blocks: int, lower: bool = True) -> TierLoad:
        """Give a fresh sequence the cached blocks among the first `blocks` of its tokens: the
        device cache's prefix, then (`lower`) the run after it the tiers below hold, loaded into
        new device blocks. Returns what was loaded from below the device."""
        bs = self.block_size
        have = self.radix.match(seq.block_hashes(bs, blocks * bs))
        self.allocator.incref(have)
        seq.block_table, seq.num_computed = list(have), len(have) * bs
        return self.load_lower(seq, blocks) if lower else NO_LOAD

    def load_lower(self, seq: Sequence, blocks: int) -> TierLoad:
        """Extend the sequence's cached prefix, up to its first `blocks` blocks, with the run of
        blocks the tiers below the device hold (kv_tiers.load_run)."""
        return kv_tiers.load_run(self, seq, blocks) if self.tiers is not None else NO_LOAD

    def _evicted(self, h: int, block: int) -> None:
        if self.tiers is not None:  # copied down while the block's bytes are still there
            self.tiers.device_evicted(h, block)
        self.allocator.decref([block])

    def match(self, hashes: Seq[int]) -> int:
        """Cached prefix length in blocks; read-only (a hit prediction must not touch the LRU)."""
        return self.radix.match_len(hashes)

    def free(self, seq: Sequence) -> None:
        """Its full blocks stay cached for the next turn."""
        if self.config.prefix_cache:
            self.cache_sequence(seq)
        self.allocator.decref(seq.block_table)
        seq.block_table = []
        seq.num_computed = 0
        seq.finished = True

    def cache_sequence(self, seq: Sequence) -> None:
        n = seq.num_computed // self.block_size
        if n == 0:
            return
        blocks = seq.block_table[:n]
        hashes = seq.block_hashes(self.block_size, n * self.block_size)
        stored = self.radix.insert(hashes, blocks)
        new = [(h, b) for h, b, s in zip(hashes, blocks, stored) if s]
        self.allocator.incref([b for _, b in new])
        if self.tiers is not None and new:
            self.tiers.device_inserted(new)

    def prefill(self, seq: Sequence, chunk_size: int | None = None) -> int:
        """Returns the first token, appended with its KV pending."""
        self.reuse_prefix(seq)
        logits = self._compute_pending(seq, chunk_size)
        if self.config.prefix_cache:
            self.cache_sequence(seq)
        return self.sample(seq, logits)

    def extend(
        self, seq: Sequence, token_ids: Seq[int], chunk_size: int | None = None
    ) -> torch.Tensor:
        """The Extend-Decode handoff, computed as a chunked prefill; next-token logits [V] fp32."""
        self.append_tokens(seq, token_ids)
        if seq.num_pending == 0:
            raise ValueError("extend with nothing to compute")
        return self._compute_pending(seq, chunk_size)

    def compute_to(self, seq: Sequence, end: int) -> None:
        """KV of known tokens up to `end`, no sampling: prefix blocks main decode's cache lost,
        or a prompt whose KV transfer failed (re-prefill from token IDs)."""
        if not seq.num_computed <= end <= len(seq.token_ids):
            raise ValueError(
                f"{seq.seq_id}: cannot compute to {end} ({seq.num_computed} computed, "
                f"{len(seq.token_ids)} known)"
            )
        while seq.num_computed < end:
            self._forward(
                [(seq, seq.num_computed, min(end, seq.num_computed + self.config.chunk_size))]
            )

    def decode(self, seqs: Seq[Sequence]) -> list[int]:
        """One step: each sequence feeds its one pending token and samples."""
        for s in seqs:
            if s.finished:
                raise ValueError(f"{s.seq_id} is finished")
            if s.num_pending != 1:
                raise ValueError(
                    f"{s.seq_id} has {s.num_pending} uncomputed tokens; decode feeds exactly "
                    "one (use prefill or extend for more)"
                )
        out: list[int] = []
        step = self.config.max_decode_rows
        for i in range(0, len(seqs), step):
            part = list(seqs[i : i + step])
            logits = self._forward([(s, s.num_computed, len(s.token_ids)) for s in part])
            out += self._sample_rows(part, logits)
        return out

    def extend_and_decode(
        self, extends: list[tuple[Sequence, Seq[int]]], decodes: Seq[Sequence]
    ) -> tuple[list[torch.Tensor], list[int]]:
        """Extends (each within one chunk) and one decode step of other sequences in one forward:
        main's handoffs ride along with its decode batch. Returns each extend's next-token logits
        [V] fp32 and the decoded tokens (sampled, as `decode`)."""
        for seq, ids in extends:
            if not ids or len(ids) > self.config.chunk_size:
                raise ValueError(
                    f"{seq.seq_id}: an extend in a decode step takes 1..{self.config.chunk_size} "
                    f"tokens, got {len(ids)}"
                )
        for s in decodes:
            if s.finished or s.num_pending != 1:
                raise ValueError(f"{s.seq_id} cannot decode now (finished or not one pending)")
        rows = sum(len(ids) for _, ids in extends) + len(decodes)
        if rows > self.max_step_tokens:
            raise ValueError(f"{rows} tokens in one step, at most {self.max_step_tokens}")
        for seq, ids in extends:
            self.append_tokens(seq, ids)
        items = [(s, s.num_computed, len(s.token_ids)) for s, _ in extends]
        items += [(s, s.num_computed, len(s.token_ids)) for s in decodes]
        logits = self._forward(items)
        n = len(extends)
        return [logits[i] for i in range(n)], self._sample_rows(list(decodes), logits[n:])

    def sample(self, seq: Sequence, logits: torch.Tensor) -> int:
        """Append the sampled token (KV pending) and update the finish state."""
        return self._sample_rows([seq], logits.view(1, -1))[0]

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

    def generate(
        self,
        requests: Seq[Request] | Seq[Seq[int]],
        sampling: SamplingParams | None = None,
        max_batch: int = 8,
        on_step: Callable[[list[Sequence]], None] | None = None,
    ) -> list[Sequence]:
        """The colocated reference: continuous batching over this engine's steps, scheduled by
        `continuous_batching.generate`. Finished sequences in request order."""
        return continuous_batching.generate(self, requests, sampling, max_batch, on_step)

    def _block_shape(self, heads: int | None = None) -> tuple[int, ...]:
        """One block of the whole model (or of `heads` KV heads): [layers, planes, block_size,
        num_kv_heads, head_dim]."""
        c = self.model_config
        return (c.num_layers, c.kv_planes, self.block_size, heads or c.num_kv_heads, c.head_dim)

    def _allocate(self, n: int, what: str) -> list[int]:
        short = n - self.allocator.num_free
        if short > 0 and self.config.prefix_cache:
            self.radix.evict(short)
        if n > self.allocator.num_free:
            raise self._full(n, what)
        return self.allocator.allocate(n)

    def _full(self, needed: int, what: str) -> KVCacheFull:
        alloc = self.allocator
        return KVCacheFull(needed, alloc.num_free, alloc.num_blocks, self.block_bytes, what)

    def reserve(self, seq: Sequence, tokens: int) -> None:
        """Allocate the blocks for `tokens` positions now, so later steps never wait for one."""
        self._ensure_blocks(seq, tokens)

    def _ensure_blocks(self, seq: Sequence, upto_tokens: int) -> None:
        need = blocks_for(upto_tokens, self.block_size) - len(seq.block_table)
        if need > 0:
            seq.block_table += self._allocate(need, seq.seq_id)

    def _compute_pending(self, seq: Sequence, chunk_size: int | None = None) -> torch.Tensor:
        chunk = self.config.chunk_size if chunk_size is None else chunk_size
        if not 1 <= chunk <= self.config.chunk_size:
            raise ValueError(f"chunk_size must be in [1, {self.config.chunk_size}], got {chunk}")
        logits = None
        while seq.num_pending:
            end = min(len(seq.token_ids), seq.num_computed + chunk)
            logits = self._forward([(seq, seq.num_computed, end)])
        assert logits is not None
        return logits[0]

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
