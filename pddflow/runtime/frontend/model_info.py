"""What the frontend needs of the model without loading its weights: tokenizer, vocabulary,
context length, end-of-sequence IDs, and how a chat becomes a prompt."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pddflow.core.hf_config import read_config
from pddflow.core.model_config import BUILTIN_CONFIGS, ModelConfig, ModelSpecError
from pddflow.operators.tokenizer import ByteTokenizer, HFTokenizer
from pddflow.runtime.frontend.chat_template import (
    ChatTemplate,
    ChatTurn,
    load_chat_renderer,
    render_chat,
    template_turn,
    tool_format,
)
from pddflow.runtime.frontend.rejection import RequestRejected


class _NoTokenizer:
    """A checkpoint without tokenizer.json: token-ID prompts work, text prompts get a clear 400."""

    def __init__(self, eos: tuple[int, ...]):
        self.eos_token_ids = eos

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        raise RequestRejected(
            400, "this model has no tokenizer.json: send `prompt` as a list of token IDs"
        )

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


@dataclass
class ModelInfo:
    tokenizer: Any
    vocab_size: int
    max_context: int
    eos_token_ids: tuple[int, ...]
    config: (
        ModelConfig  # the architecture: heads, layers, sizes (a layout's split is checked on it)
    )
    # the checkpoint's (or --chat-template's) template; None: `render_chat`'s plain rendering
    chat_template: ChatTemplate | None = None

    @property
    def tool_format(self) -> str:
        """How this model writes a tool call (api/tools.py), read from its template."""
        return tool_format(self.chat_template.source if self.chat_template else None)

    def chat_prompt_ids(
        self, messages: list[ChatTurn], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        if self.chat_template is None:
            return self.tokenizer.encode(render_chat(messages, tools))
        turns = [template_turn(m) for m in messages]
        # the template writes BOS and turn markers itself, as transformers' apply_chat_template
        return self.tokenizer.encode(self.chat_template(turns, tools), add_special_tokens=False)


def model_info(spec: str, chat_template: Path | None = None) -> ModelInfo:
    """`spec` is `builtin:<name>` or a local checkpoint directory (`hub.resolve_model` first)."""
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN_CONFIGS:
            raise ModelSpecError(f"unknown builtin model {name!r}")
        cfg = BUILTIN_CONFIGS[name]
        tok: Any = ByteTokenizer()
        renderer = load_chat_renderer(None, chat_template)
    else:
        path = Path(spec)
        cfg = read_config(path)
        tok_file = path / "tokenizer.json"
        tok = (
            HFTokenizer(tok_file, cfg.eos_token_ids)
            if tok_file.is_file()
            else _NoTokenizer(cfg.eos_token_ids)
        )
        renderer = load_chat_renderer(path, chat_template)
    return ModelInfo(
        tok, cfg.vocab_size, cfg.max_position_embeddings, tuple(tok.eos_token_ids), cfg, renderer
    )
