"""The engine: a model, a paged KV pool, a radix prefix cache and the entry points the runtime
calls (docs/engine.md, What the runtime calls). No scheduler lives here: the runtime's workers
decide what runs when, and `generate` hands the colocated reference to continuous_batching.py."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from pddflow.core.block_hash import partial_block_hash
from pddflow.core.host_memory import keep_freed_memory
from pddflow.core.kv_budget import blocks_for
from pddflow.core.payloads import KVBlocks, Request, SamplingParams
from pddflow.kernels.kv_copy import gather_blocks, scatter_blocks
from pddflow.kernels.paged_attention import (
    DEFAULT_TILE,
    Numerics,
    SeqSpan,
    calibrate,
    plan_attention,
)
from pddflow.operators import continuous_batching
from pddflow.operators.block_allocator import BlockAllocator, KVCacheFull
from pddflow.operators.config import ModelConfig
from pddflow.operators.kv_cache import KVPool, block_bytes, blocks_for_budget
from pddflow.operators.model import LlamaModel
from pddflow.operators.radix_cache import RadixCache
from pddflow.operators.sampling import sample_batch, token_logprobs
from pddflow.operators.sequence import Sequence
from pddflow.operators.weights import ModelSource, load_model_source


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16  # tokens per KV block: the unit of paging, caching and transfer
    kv_cache_bytes: int = 512 * 2**20
    chunk_size: int = 512  # most token rows per prefill/extend forward
    max_decode_rows: int = 256  # most sequences per decode forward (bigger batches split)
    attention_tile: int = DEFAULT_TILE
    prefix_cache: bool = True
    device: str = "auto"  # auto | cpu | cuda
    tune_host_malloc: bool = True  # CPU: let glibc recycle large freed buffers (host_memory)
    # torch threads, process-wide; set it when workers share a machine (OpenMP stalls otherwise)
    num_threads: int | None = None
    dtype: str | None = None  # None: fp32 on CPU, bf16 on CUDA; or float32/bfloat16/float16


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


class Engine:
    def __init__(self, source: ModelSource, config: EngineConfig = EngineConfig()):
        self.config = config
        self.source = source
        self.model_config: ModelConfig = source.config
        self.tokenizer = source.tokenizer
        self.device = torch.device(
            "cuda"
            if config.device == "auto" and torch.cuda.is_available()
            else ("cpu" if config.device == "auto" else config.device)
        )
        if config.dtype is None:
            self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        elif config.dtype in _DTYPES:
            self.dtype = _DTYPES[config.dtype]
        else:
            raise ValueError(f"unknown dtype {config.dtype!r}; valid: {', '.join(sorted(_DTYPES))}")
        if self.device.type == "cpu" and self.dtype != torch.float32:
            raise ValueError("the CPU path computes in float32 only")
        if self.device.type == "cpu" and config.tune_host_malloc:
            keep_freed_memory()
        if config.num_threads is not None:
            if config.num_threads < 1:
                raise ValueError(f"num_threads must be >= 1, got {config.num_threads}")
            torch.set_num_threads(config.num_threads)
        bs = config.block_size
        if bs <= 0 or config.attention_tile % bs:
            raise ValueError(
                f"attention_tile ({config.attention_tile}) must be a positive multiple of "
                f"block_size ({bs})"
            )
        mc = self.model_config
        self._max_rows = max(config.chunk_size, config.max_decode_rows)
        self.model = LlamaModel(mc, source.weights, self.device, self.dtype, self._max_rows)
        num_blocks = blocks_for_budget(mc, bs, self.dtype, config.kv_cache_bytes)
        self.block_bytes = block_bytes(mc, bs, self.dtype)
        if num_blocks < 1:
            raise KVCacheFull(1, 0, 0, self.block_bytes, "a single block")
        self.pool = KVPool(mc, num_blocks, bs, self.dtype, self.device)
        self.allocator = BlockAllocator(num_blocks)
        self.radix = RadixCache(
            on_evict=lambda b: self.allocator.decref([b]),
            evictable=lambda b: self.allocator.refcount(b) == 1,
        )
        self.numerics = (
            calibrate(
                mc.head_dim,
                mc.num_kv_heads,
                mc.group_size,
                config.attention_tile,
                torch.get_num_threads(),
            )
            if self.device.type == "cpu"
            else Numerics(1, True, False)
        )
        self._ids = itertools.count()

    @classmethod
    def from_spec(cls, spec: str, config: EngineConfig = EngineConfig()) -> Engine:
        return cls(load_model_source(spec), config)

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
        blocks = self.radix.match(seq.block_hashes(bs, limit * bs))
        self.allocator.incref(blocks)
        seq.block_table = list(blocks)
        seq.num_computed = len(blocks) * bs
        return seq.num_computed

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
        stored = self.radix.insert(seq.block_hashes(self.block_size, n * self.block_size), blocks)
        self.allocator.incref([b for b, new in zip(blocks, stored) if new])

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
        """Blocks [start_block, end_block) as one KVBlocks (the last may be partial)."""
        bs = self.block_size
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
        data = gather_blocks(self.pool.tensor, seq.block_table[start_block:end_block])
        return KVBlocks(seq.seq_id, hashes, token_start, token_end, bs, data)

    def import_kv(self, seq: Sequence, kv: KVBlocks, cache: bool = True) -> None:
        """Land received KV in fresh blocks; full blocks are checked against `seq`'s own hashes."""
        bs = self.block_size
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
                f"KV range [{kv.token_start}, {kv.token_end}) needs {want} blocks, "
                f"got {kv.num_blocks}"
            )
        ours = seq.block_hashes(bs, kv.token_end)[kv.token_start // bs :]
        if list(kv.block_hashes[: len(ours)]) != ours:
            raise ValueError(
                f"received KV blocks do not match the prefix of {seq.seq_id} (block hash mismatch)"
            )
        if want == 0:
            return
        blocks = self._allocate(want, f"importing {want} blocks")
        data = kv.data if isinstance(kv.data, torch.Tensor) else torch.from_numpy(kv.data)
        scatter_blocks(self.pool.tensor, blocks, data)
        seq.block_table += blocks
        seq.num_computed = kv.token_end
        if cache and self.config.prefix_cache:
            self.cache_sequence(seq)

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
        every row)."""
        for seq, _, end in items:
            self._ensure_blocks(seq, end)
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        blocks: list[int] = []
        spans: list[SeqSpan] = []
        last_rows: list[int] = []
        for seq, start, end in items:
            spans.append(SeqSpan(len(ids), end - start, start, seq.block_table))
            ids += seq.token_ids[start:end]
            rng = range(start, end)
            pos += rng
            blocks += [seq.block_table[p // bs] for p in rng]
            last_rows.append(len(ids) - 1)
        dev = self.device
        positions = torch.tensor(pos, dtype=torch.long)
        plan = plan_attention(
            spans,
            block_size=bs,
            num_layers=self.model_config.num_layers,
            num_kv_heads=self.model_config.num_kv_heads,
            group_size=self.model_config.group_size,
            device=dev,
            tile=self.config.attention_tile,
            row_multiple=self.numerics.row_multiple,
            decode_kt_view=self.numerics.decode_kt_view,
        )
        rows = torch.arange(len(ids)) if all_rows else torch.tensor(last_rows)
        with torch.inference_mode():
            logits = self.model.forward(
                torch.tensor(ids, dtype=torch.long, device=dev),
                positions.to(dev),
                torch.tensor(blocks, dtype=torch.long, device=dev),
                (positions % bs).to(dev),
                plan,
                self.pool,
                rows.to(dev),
            )
        for seq, _, end in items:
            seq.num_computed = end
        return logits

    def _sample_rows(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        toks = sample_batch(
            logits,
            [s.sampling for s in seqs],
            [s.seed for s in seqs],
            [len(s.token_ids) for s in seqs],
        )
        # only rows that asked pay for the log-softmax (one batched call for them)
        want = [i for i, s in enumerate(seqs) if s.sampling.logprobs is not None]
        if want:
            rows = logits[want] if len(want) < len(seqs) else logits
            got = token_logprobs(
                rows, [toks[i] for i in want], [seqs[i].sampling.logprobs or 0 for i in want]
            )
            for i, lp in zip(want, got):
                seqs[i].logprobs.append(lp)
        for s, t in zip(seqs, toks):
            s.token_ids.append(t)
            if t in s.sampling.stop_token_ids:
                s.finished, s.finish_reason = True, "stop"
            elif len(s.token_ids) - s.num_prompt_tokens >= s.sampling.max_tokens:
                s.finished, s.finish_reason = True, "length"
        return toks
