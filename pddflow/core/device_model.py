"""Device model: an instance's step time from a roofline, max(compute, memory) + overhead
(docs/simulator.md, Device model): the simulator times its instances with it, the modeled engine
(operators/modeled_engine.py) its steps; `sim/calibration/engine_fit.py` fits its efficiencies."""

from __future__ import annotations

from dataclasses import dataclass

from pddflow.core.arch import ModelArch
from pddflow.core.device import DeviceClass


@dataclass(frozen=True)
class Efficiency:
    prefill_mfu: float = 0.5  # achieved / peak FLOP/s
    decode_mbu: float = 0.8  # achieved / peak memory bandwidth
    step_overhead_s: float = 0.001  # fixed cost of one batch step
    # per decoding sequence per step beyond the roofline (CPU engines: sampling, bookkeeping)
    seq_overhead_s: float = 0.0
    # extra fixed cost of a step that runs prefill chunks
    prefill_overhead_s: float = 0.0
    # the same for a step of extends only; None: prefill_overhead_s
    extend_overhead_s: float | None = None
    # cost multipliers at the achieved rates (CPU engines: paged attention, gathered padded KV)
    attn_factor: float = 1.0
    kv_read_factor: float = 1.0


class DeviceModel:
    """Step-time model of one instance (`devices` accelerators of one class running one replica)."""

    __slots__ = (
        "flops_s",
        "bytes_s",
        "flops_per_token",
        "attn_flops_per_pair",
        "decode_attn_flops_per_pair",
        "_decode_extra",
        "kv_read_bytes_per_token",
        "weight_bytes",
        "step_overhead_s",
        "seq_overhead_s",
        "prefill_overhead_s",
        "extend_overhead_s",
    )

    def __init__(
        self, device: DeviceClass, devices: int, arch: ModelArch, eff: Efficiency = Efficiency()
    ):
        self.flops_s = device.tflops * 1e12 * devices * eff.prefill_mfu
        self.bytes_s = device.hbm_tbps * 1e12 * devices * eff.decode_mbu
        self.flops_per_token = arch.flops_per_token
        # FLOPs-equivalent per (query, key) pair (a decoding query's apart: MLA's absorbed form),
        # bytes-equivalent read per context token
        attn = eff.attn_factor * arch.attn_dtype_factor
        self.attn_flops_per_pair = arch.attention_flops_per_pair * attn
        self.decode_attn_flops_per_pair = arch.decode_attention_flops_per_pair * attn
        self._decode_extra = self.decode_attn_flops_per_pair - self.attn_flops_per_pair
        self.kv_read_bytes_per_token = arch.kv_bytes_per_token * eff.kv_read_factor
        self.weight_bytes = arch.weight_bytes
        self.step_overhead_s = eff.step_overhead_s
        self.seq_overhead_s = eff.seq_overhead_s
        self.prefill_overhead_s = eff.prefill_overhead_s
        self.extend_overhead_s = (
            eff.prefill_overhead_s if eff.extend_overhead_s is None else eff.extend_overhead_s
        )

    def step_s(
        self,
        new_tokens: float,
        attn_pairs: float,
        kv_read_tokens: float,
        decoding: int = 0,
        decode_pairs: float = 0.0,
    ) -> float:
        """`decode_pairs`: the part of `attn_pairs` whose queries decode (one token each)."""
        compute = (
            new_tokens * self.flops_per_token
            + attn_pairs * self.attn_flops_per_pair
            + decode_pairs * self._decode_extra
        ) / self.flops_s
        memory = (self.weight_bytes + kv_read_tokens * self.kv_read_bytes_per_token) / self.bytes_s
        return (
            (compute if compute > memory else memory)
            + self.step_overhead_s
            + decoding * self.seq_overhead_s
        )

    def decode_step_s(self, batch: int, ctx_sum: float) -> float:
        return self.step_s(batch, ctx_sum, ctx_sum, batch, ctx_sum)

    def chunk_s(self, tokens: int, cached: int = 0) -> float:
        """`tokens` new tokens over `cached` ones in one step, without the call's fixed cost."""
        return self.step_s(tokens, tokens * cached + tokens * tokens / 2, cached + tokens)

    def prefill_s(self, tokens: int, cached: int = 0) -> float:
        """One whole prompt in one step (estimates, not the simulation loop)."""
        return self.chunk_s(tokens, cached) + self.prefill_overhead_s

    def extend_s(self, tokens: int, cached: int) -> float:
        return self.chunk_s(tokens, cached) + self.extend_overhead_s

    def prefill_tokens_per_s(self, prompt_tokens: int) -> float:
        return prompt_tokens / self.prefill_s(prompt_tokens)

    def decode_tokens_per_s(self, batch: int, ctx: int) -> float:
        return batch / self.decode_step_s(batch, batch * ctx)
