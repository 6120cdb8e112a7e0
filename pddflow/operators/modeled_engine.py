"""An engine that takes modeled time (docs/engine.md, The modeled engine): every forward lasts the
simulator's device-model time (core/device_model.py) of the batch the worker formed, for the graph's
`model.arch` on the operator's device class and devices per replica; no torch is loaded.

The model is stood for by a hash chain: position p's KV is h_p = mix(h_{p-1}, token_p), and the
token after p is a function of h_p and of the sum of every KV value up to p (read as attention
reads the context). A token therefore depends on the whole context and on nothing else (not the
batch, the chunking, which worker computed the KV or which channel carried it), so every pipeline
variant emits the colocated reference's tokens, and any KV value lost or altered on the way
changes them. A block's payload is its chain values padded to `kv_scale` of the arch's true block
bytes: the channels carry real bytes, as many as the emulated links are scaled for.

The distribution is a point mass: sampling parameters and penalties cannot move it, log
probabilities are 0, and the token never is one of the request's stop tokens, so an answer runs to
its max_tokens (as the simulator's requests run to their output length). Structured output is
refused: there is no distribution to constrain."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence as Seq

import numpy as np

from pddflow.core.device_model import DeviceModel
from pddflow.core.model_config import ModelConfig
from pddflow.core.payloads import KVBlocks, TokenLogprob
from pddflow.operators.engine_config import EngineConfig
from pddflow.operators.engine_core import EngineCore
from pddflow.operators.sequence import Sequence

_SEED = 0x9E3779B9
_MASK = 0xFFFFFFFF


def chain(h: int, token: int) -> int:
    """The value at a position from the previous position's value and its token (32 bits)."""
    h = (h ^ (token + 1)) * 0x01000193 & _MASK
    return (h ^ (h >> 15)) * 0x2C1B3C6D & _MASK


def next_token(h: int, vocab: int, stop: Seq[int]) -> int:
    """The token after a position holding `h`: never one of `stop`."""
    x = (h ^ (h >> 16)) * 0x45D9F3B & _MASK
    t = (x ^ (x >> 16)) % vocab
    while t in stop:
        t = (t + 1) % vocab
    return t


class ModeledEngine(EngineCore):
    """`step`: one replica's step time (None: no waiting, a reference's tokens);
    `arch_block_bytes`: a block's true bytes (the pool holds config.kv_cache_bytes of them);
    `kv_scale`: a block's payload against that; `time_scale`: every step lasts this many times
    its modeled time."""

    no_grammar = (
        "structured output needs a model's distribution to constrain; this deployment runs the "
        "modeled engine (deploy --engine real serves it)"
    )

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        step: DeviceModel | None,
        arch_block_bytes: int,
        kv_scale: float = 1 / 256,
        time_scale: float = 1.0,
    ):
        if not 0 < kv_scale <= 1:
            raise ValueError(f"kv_scale must be in (0, 1], got {kv_scale}")
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        bs = config.block_size
        self._words = max(bs, math.ceil(arch_block_bytes * kv_scale / 4))
        num_blocks = config.kv_cache_bytes // arch_block_bytes
        max_rows = max(config.chunk_size, config.max_decode_rows)
        super().__init__(config, model_config, num_blocks, self._words * 4, max_rows)
        self.step_model, self.time_scale = step, time_scale
        self.chain = np.zeros((num_blocks, bs), dtype=np.uint32)
        self.tokenizer = None
        self.busy_s = 0.0  # modeled seconds slept through

    @classmethod
    def reference(cls, spec: str, kv_cache_bytes: int, block_size: int = 16) -> ModeledEngine:
        """The colocated reference of a modeled deployment serving `spec`: the same tokens, no
        waiting."""
        from pddflow.operators.weights import model_without_weights

        config = EngineConfig(block_size=block_size, kv_cache_bytes=kv_cache_bytes)
        model = model_without_weights(spec)
        engine = cls(config, model.config, None, 4 * block_size, 1.0)
        engine.tokenizer = model.tokenizer
        return engine

    def _forward(self, items: list[tuple[Sequence, int, int]], all_rows: bool = False):
        t0 = time.monotonic()
        new = pairs = read = decode_pairs = 0.0
        decoding = 0
        rows: list[int] = []
        for seq, start, end in items:
            self._ensure_blocks(seq, end)
            h = self._at(seq, start - 1) if start else _SEED
            values: list[int] = []
            for t in seq.token_ids[start:end]:
                h = chain(h, t)
                values.append(h)
            self._store(seq, start, values)
            ends = range(start + 1, end + 1) if all_rows else (end,)
            rows += [self._row(seq, e) for e in ends]
            n = end - start
            new += n
            pairs += n * start + n * n / 2
            read += end
            decoding += n == 1
            if n == 1:
                decode_pairs += start + 0.5
            seq.num_computed = end
        m = self.step_model
        if m is not None:
            modeled = m.step_s(new, pairs, read, decoding, decode_pairs)
            if decoding < len(items):
                modeled += m.prefill_overhead_s
            self.busy_s += modeled
            left = t0 + modeled * self.time_scale - time.monotonic()
            if left > 0:
                time.sleep(left)
        return np.array(rows, dtype=np.uint64)

    def _row(self, seq: Sequence, end: int) -> int:
        """What the token after position end - 1 is drawn from: its value and the context's sum."""
        bs = self.block_size
        full, part = divmod(end, bs)
        total = int(self.chain[seq.block_table[:full]].sum(dtype=np.uint64))
        if part:
            total += int(self.chain[seq.block_table[full], :part].sum(dtype=np.uint64))
        return chain(self._at(seq, end - 1), total & _MASK)

    def _at(self, seq: Sequence, pos: int) -> int:
        bs = self.block_size
        return int(self.chain[seq.block_table[pos // bs], pos % bs])

    def _store(self, seq: Sequence, start: int, values: list[int]) -> None:
        bs, pos, i = self.block_size, start, 0
        while i < len(values):
            off = pos % bs
            n = min(bs - off, len(values) - i)
            self.chain[seq.block_table[pos // bs], off : off + n] = values[i : i + n]
            pos, i = pos + n, i + n

    def _sample_rows(self, seqs: list[Sequence], logits) -> list[int]:
        vocab = self.model_config.vocab_size
        toks = []
        for s, h in zip(seqs, logits, strict=True):
            t = next_token(int(h), vocab, s.sampling.stop_token_ids)
            toks.append(t)
            if s.sampling.logprobs is not None:
                s.logprobs.append(TokenLogprob(0.0, ((t, 0.0),) if s.sampling.logprobs else ()))
            s.token_ids.append(t)
            if len(s.token_ids) - s.num_prompt_tokens >= s.sampling.max_tokens:
                s.finished, s.finish_reason = True, "length"
        return toks

    # ---- KV in and out ------------------------------------------------------------------------
    def export_kv(
        self, seq: Sequence, start_block: int = 0, end_block: int | None = None
    ) -> KVBlocks:
        """Blocks [start_block, end_block): each its chain values, padded to the payload size."""
        blocks, hashes, token_start, token_end = self.kv_range(seq, start_block, end_block)
        data = np.zeros((len(blocks), self._words), dtype=np.uint32)
        data[:, : self.block_size] = self.chain[blocks]
        return KVBlocks(seq.seq_id, hashes, token_start, token_end, self.block_size, data)

    def ship_kv(self, seq: Sequence, route: bytes, start_block: int = 0) -> KVBlocks:
        """One process holds the whole replica: its KV, marked as every head's."""
        kv = self.export_kv(seq, start_block)
        kv.heads = self.kv_heads
        return kv

    def import_kv(self, seq: Sequence, kv: KVBlocks, cache: bool = True) -> None:
        want = self.check_import(seq, kv)
        if want == 0:
            return
        data = np.asarray(kv.data)
        if data.shape != (want, self._words) or data.dtype != np.uint32:
            raise ValueError(
                f"KV data of shape {data.shape} ({data.dtype}) does not fit {want} modeled "
                f"blocks of {self._words} uint32"
            )
        blocks = self._allocate(want, f"importing {want} blocks")
        self.chain[blocks] = data[:, : self.block_size]
        self.landed(seq, kv, blocks, cache)
