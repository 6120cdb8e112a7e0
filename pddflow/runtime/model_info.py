"""What the frontend needs of the model without loading its weights: tokenizer, vocabulary,
context length, end-of-sequence IDs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pddflow.operators.config import ModelConfig, ModelSpecError
from pddflow.operators.tokenizer import ByteTokenizer, HFTokenizer
from pddflow.operators.weights import BUILTIN_MODELS


class _NoTokenizer:
    """A checkpoint without tokenizer.json: token-ID prompts work, text prompts get a clear 400."""

    def __init__(self, eos: tuple[int, ...]):
        self.eos_token_ids = eos

    def encode(self, text: str) -> list[int]:
        from pddflow.runtime.api import RequestRejected

        raise RequestRejected(
            400, "this model has no tokenizer.json: send `prompt` as a list of token IDs"
        )

    def decode(self, ids: list[int]) -> str:
        return ""


@dataclass
class ModelInfo:
    tokenizer: Any
    vocab_size: int
    max_context: int
    eos_token_ids: tuple[int, ...]


def model_info(spec: str) -> ModelInfo:
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN_MODELS:
            raise ModelSpecError(f"unknown builtin model {name!r}")
        cfg = BUILTIN_MODELS[name]
        tok: Any = ByteTokenizer()
    else:
        path = Path(spec)
        try:
            cfg = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelSpecError(f"{path}: cannot read config.json: {exc}") from None
        tok_file = path / "tokenizer.json"
        tok = (
            HFTokenizer(tok_file, cfg.eos_token_ids)
            if tok_file.is_file()
            else _NoTokenizer(cfg.eos_token_ids)
        )
    return ModelInfo(tok, cfg.vocab_size, cfg.max_position_embeddings, tuple(tok.eos_token_ids))
