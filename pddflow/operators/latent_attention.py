"""Multi-head latent attention (DeepSeek-V2/V3) in its absorbed form, for every row alike.

The cache keeps, per token and layer, the normalised KV latent c (kv_lora_rank values) and the
shared RoPE key (qk_rope_head_dim): one plane, one KV head (docs/engine.md, Latent attention).
A head's key for c is W_UK c and its value W_UV c; absorbing W_UK into the query (q_nope^T W_UK)
and W_UV after the average makes attention MQA over the cached plane itself: scores against
[c, k_rope], values c. Prefill, extend and decode rows all take this one path, so a token's
output never depends on which of them computed it (the uncompressed form would be cheaper for
long prefills, and would give a prefilled token other bits than a decoded one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pddflow.kernels.paged_attention import AttentionPlan, paged_attention
from pddflow.operators.kv_cache import KVPool
from pddflow.operators.linear import Linear
from pddflow.operators.norm import rms_norm
from pddflow.operators.rope import Rope

# transformers builds q_a_layernorm and kv_a_layernorm at RMSNorm's default epsilon, whatever the
# config's rms_norm_eps says
LORA_NORM_EPS = 1e-6


@dataclass
class LatentAttention:
    """One layer's MLA over this rank's query heads (all of them at TP 1): returns [T, heads x
    v_head_dim], before o_proj. Per-head absorbed projections are separate Linears, each
    batch-invariant."""

    q: Linear | None  # q_proj [heads x (nope + rope), hidden]; None with a query LoRA
    q_a: Linear | None  # q_a_proj [q_lora_rank, hidden]
    q_a_norm: torch.Tensor | None
    q_b: Linear | None  # q_b_proj [heads x (nope + rope), q_lora_rank]
    kv_a: Linear  # kv_a_proj_with_mqa [kv_lora_rank + rope, hidden]
    kv_a_norm: torch.Tensor
    absorb_k: list[Linear]  # per head: W_UK^T [kv_lora_rank, nope]
    absorb_v: list[Linear]  # per head: W_UV [v_head_dim, kv_lora_rank]
    nope: int
    rope_dim: int
    kv_lora_rank: int

    @classmethod
    def of(
        cls,
        weight,
        optional,
        kv_b: torch.Tensor,
        heads: range,
        nope: int,
        rope_dim: int,
        v_dim: int,
        max_rows: int,
    ) -> LatentAttention:
        """`weight(name)`/`optional(name)` give this rank's slice of a tensor under
        self_attn.; `kv_b` is the whole kv_b_proj [all heads x (nope + v), kv_lora_rank], of
        which `heads` are this rank's."""
        q_a = optional("q_a_proj.weight")
        per_head = kv_b.view(-1, nope + v_dim, kv_b.shape[1])
        return cls(
            q=None if q_a is not None else Linear(weight("q_proj.weight"), None, max_rows),
            q_a=None if q_a is None else Linear(q_a, None, max_rows),
            q_a_norm=optional("q_a_layernorm.weight"),
            q_b=None if q_a is None else Linear(weight("q_b_proj.weight"), None, max_rows),
            kv_a=Linear(weight("kv_a_proj_with_mqa.weight"), None, max_rows),
            kv_a_norm=weight("kv_a_layernorm.weight"),
            absorb_k=[Linear(per_head[h, :nope].t(), None, max_rows) for h in heads],
            absorb_v=[Linear(per_head[h, nope:], None, max_rows) for h in heads],
            nope=nope,
            rope_dim=rope_dim,
            kv_lora_rank=kv_b.shape[1],
        )

    def __call__(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: Rope,
        pool: KVPool,
        layer: int,
        slot_blocks: torch.Tensor,
        slot_offsets: torch.Tensor,
        plan: AttentionPlan,
        scale: float,
    ) -> torch.Tensor:
        T, H = x.shape[0], len(self.absorb_k)
        if self.q is not None:
            q = self.q(x)
        else:
            assert self.q_a is not None and self.q_b is not None and self.q_a_norm is not None
            q = self.q_b(rms_norm(self.q_a(x), self.q_a_norm, LORA_NORM_EPS))
        q = q.view(T, H, self.nope + self.rope_dim)
        ckv = self.kv_a(x)
        latent = rms_norm(ckv[:, : self.kv_lora_rank], self.kv_a_norm, LORA_NORM_EPS)
        k_rope = rope(ckv[:, self.kv_lora_rank :].reshape(T, 1, self.rope_dim), positions)
        pool.write(
            layer, torch.cat([latent.view(T, 1, -1), k_rope], -1), None, slot_blocks, slot_offsets
        )
        q_rope = rope(q[..., self.nope :], positions)
        q_latent = torch.stack([a(q[:, h, : self.nope]) for h, a in enumerate(self.absorb_k)], 1)
        o = paged_attention(torch.cat([q_latent, q_rope], -1), pool.tensor, layer, plan, scale)
        return torch.cat([a(o[:, h]) for h, a in enumerate(self.absorb_v)], -1)
