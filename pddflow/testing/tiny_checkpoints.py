"""Tiny random Hugging Face checkpoints with a real (byte-level BPE) tokenizer and a chat template,
written by transformers' own `save_pretrained`: what the parity and deployment tests load. Needs
the dev extra (transformers); nothing is downloaded."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen's ChatML, trimmed of tool calls and thinking
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Qwen2.5's tool-calling ChatML: the tools in the system turn, an assistant's calls as
# <tool_call> blocks, tool results as <tool_response> blocks of a user turn
QWEN_TOOLS_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
{%- if messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- endif %}
{%- for message in messages %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) or \
(message.role == "assistant" and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
{%- elif message.role == "assistant" %}
{{- '<|im_start|>' + message.role }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == "tool" %}
{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\
{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]
# Mistral's instruct template: BOS from the tokenizer config, user/assistant alternation enforced
# with raise_exception as the original does
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Prefill computes the prompt; decode generates one token at a time.",
    "Hello there! How are you today? I am fine, thank you.",
    "user assistant system: answer briefly and kindly.",
] * 8


def write_tokenizer(
    path: Path,
    specials: list[str],
    vocab_size: int,
    corpus: Iterable[str] = _CORPUS,
    **config,
) -> int:
    """A byte-level BPE trained on `corpus` (by default a fixed one: deterministic), `specials`
    first; saved as tokenizer.json + tokenizer_config.json (`config`: bos/eos tokens,
    chat_template). Returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096, **config}
    (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return tok.get_vocab_size()


def _randomize(model, seed: int) -> None:
    """HF's N(0, 0.02) init makes greedy decoding repeat one token: unit-scale embeddings, stronger
    projections and non-trivial norm weights make every layer (and the q/k norms) matter."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith(("proj.weight", ".w1.weight", ".w2.weight", ".w3.weight")):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
            elif name.endswith("gate.weight"):  # a router: clear winners, not near-ties
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def _tiny_dims(vocab: int, layers: int, heads: int = 4, kv_heads: int = 2) -> dict:
    """What the tiny checkpoints share: GQA (4/2 unless asked) at hidden 64, an untied head."""
    return dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )


def _special_ids(path: Path) -> dict[str, int]:
    added = json.loads((path / "tokenizer.json").read_text())["added_tokens"]
    return {t["content"]: t["id"] for t in added}


def _chatml_tokenizer(path: Path, chat_template: str) -> tuple[int, dict[str, int]]:
    """(vocabulary size, special token IDs) of a ChatML BPE tokenizer written to `path`."""
    vocab = write_tokenizer(
        path,
        CHATML_SPECIALS,
        320,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template,
    )
    return vocab, _special_ids(path)


def _mistral_tokenizer(path: Path) -> tuple[int, dict[str, int]]:
    """(vocabulary size, special token IDs) of a BPE tokenizer with Mistral's [INST] template."""
    vocab = write_tokenizer(
        path,
        MISTRAL_SPECIALS,
        320,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=MISTRAL_TEMPLATE,
    )
    return vocab, _special_ids(path)


def _save(model, path: Path, seed: int) -> Path:
    _randomize(model, seed)
    model.save_pretrained(path)
    return path


def tiny_qwen3(
    path: Path,
    seed: int = 0,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    chat_template: str = CHATML_TEMPLATE,
) -> Path:
    """Qwen3: q/k norms, head_dim 32 != hidden 64 / heads, GQA, ChatML (or, say,
    QWEN_TOOLS_TEMPLATE). Untied head: with tied embeddings a model this small echoes one token,
    and the test would compare nothing."""
    import transformers

    vocab, special = _chatml_tokenizer(path, chat_template)
    cfg = transformers.Qwen3Config(
        **_tiny_dims(vocab, layers, heads, kv_heads),
        head_dim=32,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=special["<|im_end|>"],
    )
    return _save(transformers.Qwen3ForCausalLM(cfg), path, seed)


def tiny_mistral(path: Path, seed: int = 0, layers: int = 2) -> Path:
    """Mistral: Llama-like, GQA, no sliding window (null), untied head, BOS-led [INST] template."""
    import transformers

    vocab, special = _mistral_tokenizer(path)
    cfg = transformers.MistralConfig(
        **_tiny_dims(vocab, layers),
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        sliding_window=None,
        bos_token_id=special["<s>"],
        eos_token_id=special["</s>"],
    )
    return _save(transformers.MistralForCausalLM(cfg), path, seed)


def tiny_llama(
    path: Path, seed: int = 0, layers: int = 2, heads: int = 8, kv_heads: int = 2
) -> Path:
    """Llama 3: GQA with `kv_heads` of `heads` (the tensor-parallel tests take 2, 4 and 8 of 8),
    head_dim 16, llama3 RoPE scaling, untied head, ChatML."""
    import transformers

    vocab, special = _chatml_tokenizer(path, CHATML_TEMPLATE)
    cfg = transformers.LlamaConfig(
        **_tiny_dims(vocab, layers, heads, kv_heads),
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=special["<|im_end|>"],
    )
    return _save(transformers.LlamaForCausalLM(cfg), path, seed)


def tiny_qwen3_moe(
    path: Path, seed: int = 0, layers: int = 3, experts: int = 8, heads: int = 4, kv_heads: int = 2
) -> Path:
    """Qwen3-MoE: Qwen3's attention, `experts` experts of intermediate 32, 2 per token with the
    top-k renormalised, layer 1 dense (mlp_only_layers), ChatML."""
    import transformers

    vocab, special = _chatml_tokenizer(path, CHATML_TEMPLATE)
    cfg = transformers.Qwen3MoeConfig(
        **_tiny_dims(vocab, layers, heads, kv_heads),
        head_dim=32,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        num_experts=experts,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1] if layers > 1 else [],
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=special["<|im_end|>"],
    )
    return _save(transformers.Qwen3MoeForCausalLM(cfg), path, seed)


def tiny_mixtral(path: Path, seed: int = 0, layers: int = 2, experts: int = 4) -> Path:
    """Mixtral: Mistral's attention, every layer `experts` experts (intermediate 64), 2 per
    token, no sliding window, the [INST] template."""
    import transformers

    vocab, special = _mistral_tokenizer(path)
    dims = {**_tiny_dims(vocab, layers), "intermediate_size": 64}
    cfg = transformers.MixtralConfig(
        **dims,
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        sliding_window=None,
        num_local_experts=experts,
        num_experts_per_tok=2,
        bos_token_id=special["<s>"],
        eos_token_id=special["</s>"],
    )
    return _save(transformers.MixtralForCausalLM(cfg), path, seed)


def _deepseek_dims(vocab: int, layers: int, heads: int) -> dict:
    """Latent attention at toy widths (latent 32, RoPE 16, no-RoPE 16, value 24: every width
    apart) and a mixture of 8 experts of 32, 2 per token, after one dense layer."""
    return dict(
        **_tiny_dims(vocab, layers, heads=heads, kv_heads=heads),
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=24,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=1,
        rms_norm_eps=1e-6,
    ) | {"max_position_embeddings": 256}  # YaRN's factor 4 x its original 64


def _randomize_deepseek(model, seed: int) -> None:
    """_randomize, plus what it leaves at HF's init: the fused experts at the projections'
    scale, and V3's routing bias (a buffer) large enough to change choices."""
    import torch

    _randomize(model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen) * 0.1)


def tiny_deepseek_v2(path: Path, seed: int = 0, layers: int = 3, heads: int = 4) -> Path:
    """Shaped like DeepSeek-V2-Lite: latent attention without a query LoRA, YaRN (mscale equal
    to mscale_all_dim, as V2-Lite has it), softmax routing (`greedy`), 2 shared experts, the first
    layer dense, ChatML."""
    import transformers

    vocab, special = _chatml_tokenizer(path, CHATML_TEMPLATE)
    cfg = transformers.DeepseekV2Config(
        **_deepseek_dims(vocab, layers, heads),
        q_lora_rank=None,
        n_shared_experts=2,
        topk_method="greedy",
        n_group=1,
        topk_group=1,
        norm_topk_prob=False,
        routed_scaling_factor=1.0,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=special["<|im_end|>"],
    )
    model = transformers.DeepseekV2ForCausalLM(cfg)
    _randomize_deepseek(model, seed)
    model.save_pretrained(path)
    return path


def tiny_deepseek_v3(path: Path, seed: int = 0, layers: int = 3, heads: int = 4) -> Path:
    """Shaped like DeepSeek-V3: latent attention with a query LoRA, interleaved RoPE with YaRN
    (mscale apart from mscale_all_dim, so cos and sin are scaled too), sigmoid routing with the
    correction bias over 4 groups of which 2 are kept, renormalised and scaled by 2.5, one shared
    expert, the first layer dense, ChatML."""
    import transformers

    vocab, special = _chatml_tokenizer(path, CHATML_TEMPLATE)
    cfg = transformers.DeepseekV3Config(
        **_deepseek_dims(vocab, layers, heads),
        q_lora_rank=48,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        rope_interleave=True,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=special["<|im_end|>"],
    )
    model = transformers.DeepseekV3ForCausalLM(cfg)
    _randomize_deepseek(model, seed)
    model.save_pretrained(path)
    return path
