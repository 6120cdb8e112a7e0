"""HF transformers on the engine's own weights, for `bench engine` and the parity tests."""

from __future__ import annotations

import time
from typing import Any

import torch

from pddflow.core.payloads import Request
from pddflow.operators.weights import ModelSource, moe_weight_names


def hf_model_from_source(source: ModelSource):
    import transformers

    c = source.config
    rope: dict[str, Any] = {"rope_type": c.rope_scaling.rope_type, "rope_theta": c.rope_theta}
    if c.rope_scaling.rope_type == "linear":
        rope["factor"] = c.rope_scaling.factor
    elif c.rope_scaling.rope_type == "yarn":
        rs = c.rope_scaling
        rope.update(
            factor=rs.factor,
            original_max_position_embeddings=rs.original_max_position_embeddings,
            beta_fast=rs.beta_fast,
            beta_slow=rs.beta_slow,
            truncate=rs.truncate,
            **{
                k: v
                for k in ("mscale", "mscale_all_dim", "attention_factor")
                if (v := getattr(rs, k))
            },
        )
    elif c.rope_scaling.rope_type == "llama3":
        rs = c.rope_scaling
        rope.update(
            factor=rs.factor,
            low_freq_factor=rs.low_freq_factor,
            high_freq_factor=rs.high_freq_factor,
            original_max_position_embeddings=rs.original_max_position_embeddings,
        )
    common = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings,
        rope_parameters=rope,
        tie_word_embeddings=c.tie_word_embeddings,
    )
    if c.arch == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    elif c.arch == "qwen3":
        cfg = transformers.Qwen3Config(**common, head_dim=c.head_dim, attention_bias=c.qkv_bias)
        model = transformers.Qwen3ForCausalLM(cfg)
    elif c.arch == "mistral":
        cfg = transformers.MistralConfig(**common, head_dim=c.head_dim, sliding_window=None)
        model = transformers.MistralForCausalLM(cfg)
    elif c.arch == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(
            **common,
            head_dim=c.head_dim,
            num_experts=c.num_experts,
            num_experts_per_tok=c.experts_per_token,
            moe_intermediate_size=c.moe_intermediate_size,
            norm_topk_prob=c.norm_topk_prob,
            mlp_only_layers=list(c.dense_layers),
        )
        model = transformers.Qwen3MoeForCausalLM(cfg)
    elif c.arch in ("deepseek_v2", "deepseek_v3"):
        model = _deepseek(c, common)
    elif c.arch == "mixtral":
        cfg = transformers.MixtralConfig(
            **{**common, "intermediate_size": c.moe_intermediate_size},
            head_dim=c.head_dim,
            sliding_window=None,
            num_local_experts=c.num_experts,
            num_experts_per_tok=c.experts_per_token,
        )
        model = transformers.MixtralForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(
            **common, head_dim=c.head_dim, attention_bias=c.qkv_bias, mlp_bias=c.mlp_bias
        )
        model = transformers.LlamaForCausalLM(cfg)
    state = _as_hf_state(source, set(model.state_dict()))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.endswith("lm_head.weight") for k in missing):
        raise RuntimeError(
            f"weights do not fit the HF model: missing {missing}, unexpected {unexpected}"
        )
    return model.eval()


def _deepseek(c, common: dict[str, Any]):
    """A DeepSeek-V2/V3 of the config's shapes (its head counts are the HF ones, not the latent
    cache's one KV head)."""
    import transformers

    kw = dict(
        common,
        num_key_value_heads=c.num_heads,
        kv_lora_rank=c.kv_lora_rank,
        q_lora_rank=c.q_lora_rank or None,
        qk_nope_head_dim=c.qk_nope_head_dim,
        qk_rope_head_dim=c.qk_rope_head_dim,
        v_head_dim=c.v_head_dim,
        n_routed_experts=c.num_experts,
        num_experts_per_tok=c.experts_per_token,
        moe_intermediate_size=c.moe_intermediate_size,
        n_shared_experts=c.shared_experts,
        first_k_dense_replace=len(c.dense_layers),
        n_group=c.router_groups,
        topk_group=c.router_topk_groups,
        routed_scaling_factor=c.routed_scaling_factor,
    )
    if c.arch == "deepseek_v2":
        method = "greedy" if c.router == "softmax" else c.router
        cfg = transformers.DeepseekV2Config(**kw, topk_method=method, norm_topk_prob=False)
        return transformers.DeepseekV2ForCausalLM(cfg)
    cfg = transformers.DeepseekV3Config(
        **kw, norm_topk_prob=c.norm_topk_prob, rope_interleave=c.rope_interleave
    )
    return transformers.DeepseekV3ForCausalLM(cfg)


def _as_hf_state(source: ModelSource, hf_keys: set[str]) -> dict[str, torch.Tensor]:
    """The checkpoint's weights under the HF model's names: transformers 5 keeps a layer's experts
    fused (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]) where
    checkpoints name each expert."""
    c, out = source.config, dict(source.weights)
    if not c.num_experts or not any(k.endswith("experts.gate_up_proj") for k in hf_keys):
        return out
    for i in range(c.num_layers):
        if not c.moe_layer(i):
            continue
        router, *projs = moe_weight_names(c, i)
        p = f"model.layers.{i}.mlp."
        out[p + "gate.weight"] = out.pop(router)
        names = [projs[3 * e : 3 * e + 3] for e in range(c.num_experts)]
        out[p + "experts.gate_up_proj"] = torch.stack(
            [torch.cat([out.pop(g), out.pop(u)]) for g, u, _ in names]
        )
        out[p + "experts.down_proj"] = torch.stack([out.pop(d) for _, _, d in names])
    return out


def _cache_kw(hf) -> str:
    """transformers 5 renamed `past_key_values` to `cache`; whichever forward() takes."""
    import inspect

    return "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"


def hf_decode(hf, prompts: list[list[int]], steps: int) -> float:
    """Seconds of `steps` greedy decode steps after a prefill and one warm step."""
    from transformers import DynamicCache

    kw = _cache_kw(hf)
    with torch.inference_mode():
        cache = DynamicCache()
        logits = hf(torch.tensor(prompts), **{kw: cache}, use_cache=True, logits_to_keep=1).logits
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        nxt = hf(nxt, **{kw: cache}, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
        t = time.perf_counter()
        for _ in range(steps):
            nxt = hf(nxt, **{kw: cache}, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
        return time.perf_counter() - t


def hf_extend(hf, ctx: list[int], known: list[int]) -> float:
    """Seconds of one forward over `known` after `ctx` is cached."""
    from transformers import DynamicCache

    kw = _cache_kw(hf)
    with torch.inference_mode():
        cache = DynamicCache()
        hf(torch.tensor([ctx]), **{kw: cache}, use_cache=True, logits_to_keep=1)
        t = time.perf_counter()
        hf(torch.tensor([known]), **{kw: cache}, use_cache=True, logits_to_keep=1)
        return time.perf_counter() - t


def hf_static_batches(hf, reqs: list[Request], batch: int) -> tuple[float, int, int]:
    """HF generate over consecutive groups of `batch` requests, left-padded to the group's longest
    prompt and run to its longest output (generate has no per-row stopping by length)."""
    pad = 0
    total = 0.0
    generated = padded = 0
    with torch.inference_mode():
        for i in range(0, len(reqs), batch):
            group = reqs[i : i + batch]
            width = max(len(r.prompt_ids) for r in group)
            steps = max(r.sampling.max_tokens for r in group)
            ids = torch.full((len(group), width), pad, dtype=torch.long)
            mask = torch.zeros((len(group), width), dtype=torch.long)
            for j, r in enumerate(group):
                ids[j, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
                mask[j, width - len(r.prompt_ids) :] = 1
            t = time.perf_counter()
            out = hf.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=steps,
                min_new_tokens=steps,
                do_sample=False,
                pad_token_id=pad,
                eos_token_id=None,
            )
            total += time.perf_counter() - t
            generated += (out.shape[1] - width) * len(group)
            padded += width * len(group)
    return total, generated, padded
