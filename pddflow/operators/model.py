"""The Llama-architecture decoder (Llama, Mistral, Qwen2, Qwen3; Qwen3-MoE and Mixtral with a
mixture of experts for the MLP; DeepSeek-V2/V3 with latent attention and shared experts) over the
paged KV pool; every op is row-wise or batch-invariant, so any mix of prefill, extend and decode
rows can share a forward."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pddflow.core.model_config import ModelConfig
from pddflow.kernels.paged_attention import AttentionPlan, paged_attention
from pddflow.operators.kv_cache import KVPool
from pddflow.operators.latent_attention import LatentAttention
from pddflow.operators.linear import Linear
from pddflow.operators.mlp import GatedMLP, MixtureOfExperts, Routing
from pddflow.operators.norm import rms_norm
from pddflow.operators.rope import Rope
from pddflow.operators.tensor_parallel import Shard
from pddflow.operators.weights import moe_weight_names


@dataclass
class _Layer:
    ln1: torch.Tensor
    ln2: torch.Tensor
    qkv: Linear | None  # None: latent attention (mla)
    o: Linear
    mlp: GatedMLP | MixtureOfExperts
    mla: LatentAttention | None = None
    q_norm: torch.Tensor | None = None  # Qwen3: per-head RMSNorm weights [head_dim]
    k_norm: torch.Tensor | None = None
    # tensor parallel: o and down hold partial sums; their biases are added once, after the sum
    o_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None


class LlamaModel:
    """`shard` (tensor parallel): keep this rank's heads and intermediate columns, computing with
    `shard.local`'s head counts; `reduce` sums the row-parallel partials over the ranks. Embedding,
    norms and LM head stay whole on every rank."""

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
        max_rows: int = 512,
        shard: Shard | None = None,
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.config = shard.local if shard is not None else config
        self.device, self.dtype = device, dtype
        self.reduce = reduce

        def w(name: str, part: str = "") -> torch.Tensor:
            t = weights[name]
            if shard is not None and part:
                t = shard.slice(t, part)
            return t.to(device=device, dtype=dtype)

        def opt(name: str, part: str = "") -> torch.Tensor | None:
            return w(name, part) if name in weights else None

        def cat_bias(names: list[tuple[str, str]]) -> torch.Tensor | None:
            # a fused projection has all its biases or none
            parts = [opt(n, part) for n, part in names]
            return None if any(p is None for p in parts) else torch.cat(parts)  # type: ignore[arg-type]

        whole = shard is None  # row-parallel biases: fused at TP 1, added after the sum else

        def gated(gate: str, up: str, down: str, part: str, bias: bool) -> GatedMLP:
            """Gate and up column-parallel over `part`'s columns, down row-parallel."""
            gate_up = torch.cat([w(gate + ".weight", part), w(up + ".weight", part)])
            biases = cat_bias([(gate + ".bias", part), (up + ".bias", part)]) if bias else None
            down_bias = opt(down + ".bias") if bias and whole else None
            inter = gate_up.shape[0] // 2
            return GatedMLP(
                Linear(gate_up, biases, max_rows),
                Linear(w(down + ".weight", f"{part}_down"), down_bias, max_rows),
                inter,
            )

        def feed_forward(i: int) -> GatedMLP | MixtureOfExperts:
            m = f"model.layers.{i}.mlp."
            if not config.moe_layer(i):
                return gated(m + "gate_proj", m + "up_proj", m + "down_proj", "inter", True)
            router, *projs = moe_weight_names(config, i)
            experts: list[GatedMLP | None] = []
            for e in range(config.num_experts):
                if shard is not None and not shard.holds_expert(e):
                    experts.append(None)  # another rank's (expert parallel)
                    continue
                gate, up, down = (n.removesuffix(".weight") for n in projs[3 * e : 3 * e + 3])
                experts.append(gated(gate, up, down, "expert", bias=False))
            s = m + "shared_experts."
            shared = config.shared_experts and gated(
                s + "gate_proj", s + "up_proj", s + "down_proj", "shared", bias=False
            )
            bias = router.removesuffix("weight") + "e_score_correction_bias"
            return MixtureOfExperts(
                Linear(w(router), None, max_rows),
                experts,
                Routing.of(config),
                weights[bias].float().to(device) if config.router_bias else None,
                shared or None,
            )

        def latent_attention(i: int) -> LatentAttention:
            a = f"model.layers.{i}.self_attn."
            heads = range(shard.h0, shard.h1) if shard is not None else range(config.num_heads)
            return LatentAttention.of(
                lambda n: w(
                    a + n, {"q_proj.weight": "mla_q", "q_b_proj.weight": "mla_q"}.get(n, "")
                ),
                lambda n: opt(a + n),
                w(a + "kv_b_proj.weight"),
                heads,
                config.qk_nope_head_dim,
                config.qk_rope_head_dim,
                config.v_head_dim,
                max_rows,
            )

        def qkv(a: str) -> Linear:
            return Linear(
                torch.cat(
                    [
                        w(a + "q_proj.weight", "q"),
                        w(a + "k_proj.weight", "kv"),
                        w(a + "v_proj.weight", "kv"),
                    ]
                ),
                cat_bias(
                    [(a + "q_proj.bias", "q"), (a + "k_proj.bias", "kv"), (a + "v_proj.bias", "kv")]
                ),
                max_rows,
            )

        self.embed = w("model.embed_tokens.weight")
        self.layers: list[_Layer] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            o_bias, down_bias = opt(a + "o_proj.bias"), opt(m + "down_proj.bias")
            self.layers.append(
                _Layer(
                    ln1=w(p + "input_layernorm.weight"),
                    ln2=w(p + "post_attention_layernorm.weight"),
                    qkv=None if config.mla else qkv(a),
                    o=Linear(
                        w(a + "o_proj.weight", "mla_o" if config.mla else "o"),
                        o_bias if whole else None,
                        max_rows,
                    ),
                    mlp=feed_forward(i),
                    mla=latent_attention(i) if config.mla else None,
                    q_norm=opt(a + "q_norm.weight") if config.qk_norm else None,
                    k_norm=opt(a + "k_norm.weight") if config.qk_norm else None,
                    o_bias=None if whole else o_bias,
                    down_bias=None if whole else down_bias,
                )
            )
        self.norm = w("model.norm.weight")
        head = self.embed if config.tie_word_embeddings else w("lm_head.weight")
        self.lm_head = Linear(head, None, max_rows)
        self.rope = Rope(config, device, dtype)
        self.scale = config.softmax_scale

    def _attention(
        self,
        layer: _Layer,
        i: int,
        x: torch.Tensor,
        positions: torch.Tensor,
        slot_blocks: torch.Tensor,
        slot_offsets: torch.Tensor,
        plan: AttentionPlan,
        pool: KVPool,
    ) -> torch.Tensor:
        """Grouped-query attention of layer i: [T, heads x head_dim], before o_proj."""
        c = self.config
        T = x.shape[0]
        H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        qd, kvd = H * D, Hkv * D
        assert layer.qkv is not None
        qkv = layer.qkv(x)
        q = qkv[:, :qd].view(T, H, D)
        k = qkv[:, qd : qd + kvd].view(T, Hkv, D)
        if layer.q_norm is not None and layer.k_norm is not None:  # Qwen3, before RoPE
            q = rms_norm(q, layer.q_norm, c.rms_norm_eps)
            k = rms_norm(k, layer.k_norm, c.rms_norm_eps)
        q = self.rope(q, positions)
        k = self.rope(k, positions)
        v = qkv[:, qd + kvd :].view(T, Hkv, D)
        pool.write(i, k, v, slot_blocks, slot_offsets)
        return paged_attention(q, pool.tensor, i, plan, self.scale).reshape(T, qd)

    def _row_parallel(self, y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.reduce is None:
            return y
        y = self.reduce(y)
        return y if bias is None else y + bias

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_blocks: torch.Tensor,
        slot_offsets: torch.Tensor,
        plan: AttentionPlan,
        pool: KVPool,
        logit_rows: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """Run T token rows, writing their K/V into `pool`; fp32 logits of `logit_rows` (None:
        no logits, a follower's forward)."""
        c = self.config
        h = self.embed[input_ids]
        for i, layer in enumerate(self.layers):
            x = rms_norm(h, layer.ln1, c.rms_norm_eps)
            if layer.mla is not None:
                attn = layer.mla(
                    x, positions, self.rope, pool, i, slot_blocks, slot_offsets, plan, self.scale
                )
            else:
                attn = self._attention(
                    layer, i, x, positions, slot_blocks, slot_offsets, plan, pool
                )
            h = h + self._row_parallel(layer.o(attn), layer.o_bias)
            x = rms_norm(h, layer.ln2, c.rms_norm_eps)
            h = h + self._row_parallel(layer.mlp(x), layer.down_bias)
        if logit_rows is None:
            return None
        x = rms_norm(h.index_select(0, logit_rows), self.norm, c.rms_norm_eps)
        return self.lm_head(x).float()
