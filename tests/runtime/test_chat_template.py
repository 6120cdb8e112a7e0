"""Chat templates: found where transformers looks (chat_template.jinja, tokenizer_config.json),
rendered as apply_chat_template renders them, refusals a ValueError (the API's 400), overridden
by --chat-template; the built-in model keeps the plain rendering; `deploy --model` refuses an
unsupported architecture at start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pddflow.core.model_config import ModelSpecError
from pddflow.runtime.api.schema import ChatMessage
from pddflow.runtime.frontend.chat_template import (
    ChatTemplateError,
    find_template,
    load_chat_renderer,
    render_chat,
)
from pddflow.runtime.frontend.model_info import model_info
from pddflow.testing.tiny_checkpoints import (
    CHATML_SPECIALS,
    CHATML_TEMPLATE,
    MISTRAL_SPECIALS,
    MISTRAL_TEMPLATE,
    write_tokenizer,
)

ROOT = Path(__file__).resolve().parents[2]
CHAT = [
    {"role": "user", "content": "Hello there!"},
    {"role": "assistant", "content": "Fine, thank you."},
    {"role": "user", "content": "How are you today?"},
]
# what HF templates lean on: loop controls, tojson (unescaped), namespaces, bos/eos strings
RICH = (
    "{{ bos_token }}{% set ns = namespace(n=0) %}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}"
    "{{ m['role'] | upper }} {{ m['content'] | tojson }} <&>{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT ({{ ns.n }}):{% endif %}"
)


def _checkpoint_dir(tmp_path: Path, specials, **config) -> Path:
    d = tmp_path / "ckpt"
    vocab = write_tokenizer(d, specials, 300, **config)
    cfg = {
        "model_type": "mistral",
        "vocab_size": vocab,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "eos_token_id": 2,
        "sliding_window": None,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _msgs(chat: list[dict]) -> list[ChatMessage]:
    return [ChatMessage(**m) for m in chat]


def test_checkpoint_template_is_rendered_and_tokenized_without_extra_bos(tmp_path):
    d = _checkpoint_dir(
        tmp_path, MISTRAL_SPECIALS, bos_token="<s>", eos_token="</s>", chat_template=RICH
    )
    info = model_info(str(d))
    text = info.chat_template([dict(m) for m in CHAT])
    assert text.startswith('<s>USER "Hello there!" <&></s>\n')
    assert text.endswith("ASSISTANT (3):")
    ids = info.chat_prompt_ids(_msgs(CHAT))
    assert ids == info.tokenizer.encode(text, add_special_tokens=False)
    assert ids.count(1) == 1  # <s> once: the template's, none added on top


def test_template_sources(tmp_path):
    d = _checkpoint_dir(
        tmp_path,
        CHATML_SPECIALS,
        eos_token={"content": "<|im_end|>", "__type": "AddedToken"},
        chat_template=[{"name": "tool_use", "template": "x"}, {"name": "default", "template": "y"}],
    )
    template, specials = find_template(d)
    assert template == "y" and specials == {"eos_token": "<|im_end|>"}
    (d / "chat_template.jinja").write_text(CHATML_TEMPLATE)  # transformers >= 4.50 writes this
    assert find_template(d)[0] == CHATML_TEMPLATE
    override = tmp_path / "mine.jinja"
    override.write_text("{{ messages | length }}")
    assert load_chat_renderer(d, override)(CHAT) == "3"


def test_raise_exception_is_a_value_error(tmp_path):
    d = _checkpoint_dir(
        tmp_path,
        MISTRAL_SPECIALS,
        bos_token="<s>",
        eos_token="</s>",
        chat_template=MISTRAL_TEMPLATE,
    )
    info = model_info(str(d))
    with pytest.raises(ChatTemplateError, match="roles must alternate") as err:
        info.chat_prompt_ids(_msgs([{"role": "assistant", "content": "Hi"}]))
    assert isinstance(err.value, ValueError)  # what the chat endpoint answers with a 400


def test_bad_templates_fail_at_start(tmp_path):
    d = _checkpoint_dir(tmp_path, CHATML_SPECIALS, chat_template="{% for m in messages %}")
    with pytest.raises(ModelSpecError, match="chat template from .*line 1"):
        model_info(str(d))
    with pytest.raises(ModelSpecError, match="--chat-template .*nope.jinja"):
        model_info("builtin:tiny-llama", tmp_path / "nope.jinja")


def test_builtin_and_template_less_checkpoints_keep_the_plain_rendering(tmp_path):
    info = model_info("builtin:tiny-llama")
    assert info.chat_template is None
    assert info.chat_prompt_ids(_msgs(CHAT)) == info.tokenizer.encode(render_chat(_msgs(CHAT)))
    d = _checkpoint_dir(tmp_path, CHATML_SPECIALS)
    assert model_info(str(d)).chat_template is None


@pytest.mark.slow  # imports transformers
@pytest.mark.parametrize("template", [RICH, CHATML_TEMPLATE, MISTRAL_TEMPLATE])
def test_rendering_equals_transformers(tmp_path, template):
    transformers = pytest.importorskip("transformers")
    d = _checkpoint_dir(
        tmp_path, MISTRAL_SPECIALS, bos_token="<s>", eos_token="</s>", chat_template=template
    )
    tok = transformers.AutoTokenizer.from_pretrained(d)
    ref = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    info = model_info(str(d))
    assert info.chat_template(CHAT) == ref
    assert info.chat_prompt_ids(_msgs(CHAT)) == tok.encode(ref, add_special_tokens=False)


def test_deploy_refuses_an_unsupported_architecture_at_start(tmp_path):
    d = tmp_path / "gemma"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]})
    )
    out = subprocess.run(
        [sys.executable, "-m", "pddflow.cli", "deploy", "pdd", "--model", str(d)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --model: model_type 'gemma2'")
    assert "'qwen3'" in lines[0] and "'mistral'" in lines[0]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.mark.slow  # imports transformers
def test_tools_and_tool_turns_render_as_transformers_renders_them(tmp_path):
    """A tiny random Qwen3 checkpoint with Qwen's tool-calling template: the tools, an
    assistant's call and the tool's result render exactly as transformers'
    apply_chat_template(tools=...) (arguments handed to the template as a mapping, as
    transformers expects them); the model's call format is read as hermes."""
    transformers = pytest.importorskip("transformers")
    from pddflow.testing.tiny_checkpoints import QWEN_TOOLS_TEMPLATE, tiny_qwen3

    d = tiny_qwen3(tmp_path / "qwen3-tools", chat_template=QWEN_TOOLS_TEMPLATE)
    tok = transformers.AutoTokenizer.from_pretrained(d)
    hf_chat = json.loads(json.dumps(TOOL_CHAT))
    hf_chat[2]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    ref = tok.apply_chat_template(hf_chat, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert "<tools>" in ref and '"name": "get_weather"' in ref and "<tool_response>" in ref
    info = model_info(str(d))
    ids = info.chat_prompt_ids(_msgs(TOOL_CHAT), TOOLS)
    assert ids == tok.encode(ref, add_special_tokens=False)
    assert info.tool_format == "hermes"


def test_the_plain_rendering_lists_tools_and_calls():
    text = render_chat(_msgs(TOOL_CHAT), TOOLS)
    assert text.startswith("<|tools|>\n" + json.dumps(TOOLS[0]) + "\n")
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    )
    assert '<|tool|>\n{"temp_c": 21}\n' in text and text.endswith("<|assistant|>\n")
