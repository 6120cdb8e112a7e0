"""What every engine shares, without torch: sequences, the block allocator, the radix prefix cache
and the step entry points the runtime calls (docs/engine.md, What the runtime calls). A subclass
computes: `Engine` (engine.py) runs the model on its paged KV pool, `ModeledEngine`
(modeled_engine.py) takes the device model's time and stands for the model with a hash chain."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Any

from pddflow.core.block_hash import partial_block_hash
from pddflow.core.kv_budget import blocks_for
from pddflow.core.model_config import ModelConfig
from pddflow.core.payloads import KVBlocks, Request, SamplingParams
from pddflow.operators import continuous_batching
from pddflow.operators.block_allocator import BlockAllocator, KVCacheFull
from pddflow.operators.cache_state import NO_LOAD, TierLoad
from pddflow.operators.engine_config import EngineConfig
from pddflow.operators.radix_cache import RadixCache
from pddflow.operators.sequence import Sequence


class TPPeerLost(RuntimeError):
    """A collective failed or timed out: a rank of this instance (or its leader) is gone."""


class KVShardMissing(RuntimeError):
    """A rank of this instance lacks its heads of the KV being landed (not arrived yet, or lost):
    nothing landed on any rank."""


Logits = Any  # what `_forward` returns per row and `_sample_rows` reads: the subclass's own


class EngineCore:
    """`num_blocks` of `block_bytes` (whole-model bytes) each; steps of at most `max_rows` rows."""

    tiers: Any = None  # KVTiers under the radix cache (Engine's, when configured)
    no_grammar: str | None = None  # why structured output is refused (None: it is served)

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        num_blocks: int,
        block_bytes: int,
        max_rows: int,
    ):
        if num_blocks < 1:
            raise KVCacheFull(1, 0, 0, block_bytes, "a single block")
        self.config = config
        self.model_config = model_config
        self.block_bytes = block_bytes
        self._max_rows = max_rows
        self.allocator = BlockAllocator(num_blocks)
        self.radix = RadixCache(
            on_evict=self._evicted, evictable=lambda b: self.allocator.refcount(b) == 1
        )
        self._ids = itertools.count()

    # ---- what a subclass computes -------------------------------------------------------------
    def _forward(self, items: list[tuple[Sequence, int, int]], all_rows: bool = False) -> Logits:
        """KV of tokens [start, end) of each sequence; each item's last-row logits (or every
        row's), indexable by row."""
        raise NotImplementedError

    def _sample_rows(self, seqs: list[Sequence], logits: Logits) -> list[int]:
        """Sample row i for seqs[i], append the token (KV pending), update the finish state."""
        raise NotImplementedError

    @property
    def is_leader(self) -> bool:
        return True

    @property
    def kv_heads(self) -> tuple[int, int]:
        """The model's KV heads [a, b) this rank holds."""
        return 0, self.model_config.num_kv_heads

    def close(self) -> None:
        if self.tiers is not None:
            self.tiers.close(remove_disk=not self.config.disk_cache_persist)
            self.tiers = None

    # ---- sequences and the cache --------------------------------------------------------------
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
        ids = list(map(int, prompt_ids))
        if not ids:
            raise ValueError("empty prompt")
        if sampling.grammar and self.no_grammar:
            raise ValueError(self.no_grammar)
        vocab = self.model_config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:  # in C: a prompt of thousands costs microseconds
            bad = [t for t in ids if not 0 <= t < vocab]
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
        blocks the tiers below the device hold (none here: Engine's tiers)."""
        return NO_LOAD

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

    # ---- steps --------------------------------------------------------------------------------
    def prefill(self, seq: Sequence, chunk_size: int | None = None) -> int:
        """Returns the first token, appended with its KV pending."""
        self.reuse_prefix(seq)
        logits = self._compute_pending(seq, chunk_size)
        if self.config.prefix_cache:
            self.cache_sequence(seq)
        return self.sample(seq, logits)

    def extend(self, seq: Sequence, token_ids: Seq[int], chunk_size: int | None = None) -> Logits:
        """The Extend-Decode handoff, computed as a chunked prefill; the next token's logits."""
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
    ) -> tuple[list[Logits], list[int]]:
        """Extends (each within one chunk) and one decode step of other sequences in one forward:
        main's handoffs ride along with its decode batch. Returns each extend's next-token logits
        and the decoded tokens (sampled, as `decode`)."""
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

    def sample(self, seq: Sequence, logits: Logits) -> int:
        """Append the sampled token (KV pending) and update the finish state."""
        return self._sample_rows([seq], logits[None])[0]

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

    def _compute_pending(self, seq: Sequence, chunk_size: int | None = None) -> Logits:
        chunk = self.config.chunk_size if chunk_size is None else chunk_size
        if not 1 <= chunk <= self.config.chunk_size:
            raise ValueError(f"chunk_size must be in [1, {self.config.chunk_size}], got {chunk}")
        logits = None
        while seq.num_pending:
            end = min(len(seq.token_ids), seq.num_computed + chunk)
            logits = self._forward([(seq, seq.num_computed, end)])
        assert logits is not None
        return logits[0]

    # ---- KV in and out: the checks every engine makes -----------------------------------------
    def kv_range(self, seq: Sequence, start_block: int, end_block: int | None):
        """(block ids, block hashes, token_start, token_end) of blocks [start_block, end_block)."""
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
        return seq.block_table[start_block:end_block], hashes, token_start, token_end

    def check_import(self, seq: Sequence, kv: KVBlocks) -> int:
        """The blocks `kv` lands for `seq` (ValueError when it does not continue it)."""
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
                f"KV range [{kv.token_start}, {kv.token_end}) needs {want} blocks, got "
                f"{kv.num_blocks}"
            )
        ours = seq.block_hashes(bs, kv.token_end)[kv.token_start // bs :]
        if list(kv.block_hashes[: len(ours)]) != ours:
            raise ValueError(
                f"received KV blocks do not match the prefix of {seq.seq_id} (block hash mismatch)"
            )
        if kv.heads is not None and kv.heads != self.kv_heads:
            raise ValueError(
                f"KV of heads {list(kv.heads)} sent to the rank holding heads {list(self.kv_heads)}"
            )
        return want

    def landed(self, seq: Sequence, kv: KVBlocks, blocks: list[int], cache: bool) -> None:
        """`kv` is in `blocks` now: they join the sequence (and its cache)."""
        seq.block_table += blocks
        seq.num_computed = kv.token_end
        if cache and self.config.prefix_cache:
            self.cache_sequence(seq)
