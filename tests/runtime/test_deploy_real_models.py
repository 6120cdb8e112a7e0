"""Acceptance for real checkpoints: tiny random Mistral, the mixture of experts Qwen3-MoE (GQA, its
head_dim apart from hidden / heads) and a DeepSeek-V3 shape (latent attention: one latent per
token crosses the WAN) (with a trained BPE tokenizer and a chat template, made here by
transformers) served by `pddflow deploy graphs/pdd.yaml --model DIR`: the official openai
client's greedy chat output is exactly transformers' greedy output on the chat-templated prompt
(the MoE ones on every route: p_md, one-shot and catch-up handoffs). One checkpoint per KV layout
the deployment moves: the other families (Qwen3, Mixtral, DeepSeek-V2) share these layouts and
are held to transformers' logits and greedy tokens by tests/engine/test_engine_hf_parity.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess

pytestmark = pytest.mark.slow  # starts deployments: worker processes

ROOT = Path(__file__).resolve().parents[2]
MAX_TOKENS = 16

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

CHATS = [
    [{"role": "user", "content": "Hello there! How are you today?"}],
    [
        {"role": "user", "content": "The quick brown fox."},
        {"role": "assistant", "content": "jumps over the lazy dog."},
        {"role": "user", "content": "Prefill computes the prompt; decode generates."},
    ],
]
# a template of the operator's own (--chat-template): a preamble the checkpoint's lacks, and a
# refusal through raise_exception
OVERRIDE = (
    "{{ bos_token }}[INST] Answer briefly. [/INST]"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ raise_exception('no system turns here') }}{% endif %}"
    "{{ message['role'] + ': ' + message['content'] + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)


def _reference(path: Path, chat: list[dict], template: str | None) -> list[int]:
    """transformers end to end: its tokenizer's apply_chat_template, its greedy generate."""
    import torch

    tok = transformers.AutoTokenizer.from_pretrained(path)
    text = tok.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=False, chat_template=template
    )
    ids = tok.encode(text, add_special_tokens=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0
        )
    return out[0, len(ids) :].tolist()


def _strip_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids


# the scheduler's choice, or a forced (variant, handoff)
ROUTES = {
    "dense": [None],
    "moe": [("p_md", None), ("p_rld_md", "one_shot"), ("p_rld_md", "catch_up")],
}


# the mixtures of experts are served exactly by the two-rank test below (prefill and main on two
# ranks, the relay on one): one deployment each, not two
@pytest.mark.parametrize("arch", ["mistral"])
def test_deploy_serves_a_real_checkpoint_exactly(arch, tmp_path):
    import torch

    from pddflow.testing import tiny_checkpoints as tiny

    torch.set_num_threads(1)
    path = getattr(tiny, f"tiny_{arch}")(tmp_path / arch, seed=5)
    eos = transformers.AutoConfig.from_pretrained(path).eos_token_id
    extra: list[str] = []
    template = None
    if arch == "mistral":  # its template replaced by --chat-template (OVERRIDE)
        (tmp_path / "chat.jinja").write_text(OVERRIDE)
        extra, template = ["--chat-template", str(tmp_path / "chat.jinja")], OVERRIDE
    refs = [_reference(path, chat, template) for chat in CHATS]
    assert any(len(set(r)) > 3 for r in refs), "degenerate test model"

    dep = DeployProcess(
        ROOT / "graphs" / "pdd.yaml", tmp_path / "run", "--model", str(path), *extra
    )
    try:
        client = openai.OpenAI(
            base_url=f"{dep.base}/v1", api_key="unused", timeout=60, max_retries=0
        )
        routes = ROUTES["dense"]
        for (chat, ref), route in [(c, r) for c in zip(CHATS, refs) for r in routes]:
            extra_body = {"return_token_ids": True}
            if route is not None:
                extra_body.update(variant=route[0], handoff=route[1])
            r = client.chat.completions.create(
                model="pdd",
                messages=chat,
                max_tokens=MAX_TOKENS,
                temperature=0,
                extra_body=extra_body,
            )
            ids = r.choices[0].model_extra["token_ids"]
            assert _strip_eos(ids, eos) == _strip_eos(ref, eos), route
            assert r.choices[0].message.content  # decoded by the checkpoint's tokenizer
        per_token = _kv_bytes_per_token(json.loads((path / "config.json").read_text()))
        assert dep.health()["kv_bytes_per_token"] == per_token
        if arch == "mistral":  # the template's raise_exception is the client's 400
            with pytest.raises(openai.BadRequestError, match="no system turns"):
                client.chat.completions.create(
                    model="pdd", messages=[{"role": "system", "content": "Hi"}], max_tokens=4
                )
    finally:
        dep.stop()
    assert dep.leftover_children() == []


def _kv_bytes_per_token(config: dict) -> int:
    """fp32, all layers: K and V of every KV head, or latent attention's latent and RoPE key."""
    if "kv_lora_rank" in config:
        return (
            4 * config["num_hidden_layers"] * (config["kv_lora_rank"] + config["qk_rope_head_dim"])
        )
    return 4 * 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"]


def _assert_cold_prompt_bytes(client, dep, per_token: int) -> None:
    """A cold prompt's KV crosses the WAN once, at the served model's bytes per token (its last
    block whole)."""
    before = dep.metric("pddflow_wan_bytes_sent_total")
    r = client.completions.create(
        model="pdd",
        prompt="A cold prompt for the mixture of experts, a few blocks long. " * 3,
        max_tokens=2,
        temperature=0,
        extra_body={"variant": "p_md"},
    )
    sent, tokens = dep.metric("pddflow_wan_bytes_sent_total") - before, r.usage.prompt_tokens
    assert tokens * per_token <= sent <= -(-tokens // 16) * 16 * per_token, (sent, tokens)


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
def test_an_moe_replica_on_two_ranks_expert_parallel(arch, tmp_path):
    """Prefill on 2 ranks (heads and every expert's columns split) and main on 2 ranks expert
    parallel (4 whole experts each), relay on one: every chat's output on every route is
    transformers' (the mixtures' only deployment; the relay's one rank serves them unsplit).
    DeepSeek-V3's latent is no head to split: every rank keeps it whole, and it crosses the WAN
    once per instance."""
    import torch

    from pddflow.testing import tiny_checkpoints as tiny

    torch.set_num_threads(1)
    path = getattr(tiny, f"tiny_{arch}")(tmp_path / "moe", seed=5)
    eos = transformers.AutoConfig.from_pretrained(path).eos_token_id
    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    layout = "devices_per_replica: {prefill: 1, relay: 1, main: 1}"
    main = "params: {radix_cache: true}}"
    assert layout in text and main in text
    text = text.replace(layout, "devices_per_replica: {prefill: 2, relay: 1, main: 2}")
    text = text.replace(main, "params: {radix_cache: true, expert_parallel: true}}")
    graph = tmp_path / "pdd.yaml"
    graph.write_text(text)
    refs = [_reference(path, chat, None) for chat in CHATS]
    assert any(len(set(r)) > 3 for r in refs), "degenerate test model"
    dep = DeployProcess(graph, tmp_path / "run", "--model", str(path), startup_s=240)
    try:
        client = openai.OpenAI(
            base_url=f"{dep.base}/v1", api_key="unused", timeout=120, max_retries=0
        )
        health = dep.health()
        assert len(health["workers"]["main/0"]["ranks"]) == 2
        per_token = _kv_bytes_per_token(json.loads((path / "config.json").read_text()))
        assert health["kv_bytes_per_token"] == per_token
        for (chat, ref), (variant, handoff) in [
            (c, r) for c in zip(CHATS, refs, strict=True) for r in ROUTES["moe"]
        ]:
            r = client.chat.completions.create(
                model="pdd",
                messages=chat,
                max_tokens=MAX_TOKENS,
                temperature=0,
                extra_body={"return_token_ids": True, "variant": variant, "handoff": handoff},
            )
            ids = r.choices[0].model_extra["token_ids"]
            assert _strip_eos(ids, eos) == _strip_eos(ref, eos), (variant, handoff)
            assert r.choices[0].message.content  # decoded by the checkpoint's tokenizer
        _assert_cold_prompt_bytes(client, dep, per_token)
    finally:
        dep.stop()
    assert dep.leftover_children() == []
