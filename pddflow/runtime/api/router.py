"""What the API needs of the deployment's router (`runtime.frontend.Frontend` is the one that
ships; the API's tests serve a fake): the API only translates HTTP to these calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

from pddflow.core.payloads import SamplingParams


class TokenizerLike(Protocol):
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


class Router(Protocol):
    model_id: str
    tokenizer: TokenizerLike
    vocab_size: int
    max_context: int
    tool_format: str  # how the model writes a tool call (frontend/chat_template.py)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None: ...
    def chat_prompt_ids(
        self, messages: list[Any], tools: list[dict[str, Any]] | None = None
    ) -> list[int]: ...
    def health(self) -> tuple[bool, dict[str, Any]]: ...
    def metrics_text(self) -> tuple[bytes, str]: ...
    def timeline(self, request_id: str) -> dict[str, Any] | None: ...
    def cached_tokens(self, request_id: str) -> int:
        """Prompt tokens of the request whose KV came from a prefix cache (the usage's)."""
        ...

    def max_serving_tokens(self) -> int | None:
        """The longest prompt + output every decoder's KV memory holds (None: not known yet)."""
        ...

    def stopped(self, request_id: str) -> None:
        """The request's output hit a stop string: it finished (`stop`), and the API is about to
        end its stream, cancelling what still runs."""
        ...

    def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        deadline: float,
        variant: str | None,
        handoff: str | None,
    ) -> AsyncIterator[list[int]]:
        """Chunks of generated IDs; when `sampling.logprobs` asks, a chunk may carry them as
        `.logprobs` (a `core.payloads.TokenChunk`): a plain list reports none (`null`)."""
        ...


class LinkControl(Protocol):
    """The admin endpoints' drills on the emulated WAN (`frontend.link_admin.LinkAdmin`)."""

    def can_cut(self) -> bool: ...
    def cut(self, link: str, seconds: float, after_bytes: int = 0) -> dict[str, Any]: ...
    def partition(
        self, link: str, seconds: float, loss: float = 1.0, from_cluster: str | None = None
    ) -> dict[str, Any]: ...
    def degrade(self, link: str, gbps: float, jitter_p99_ms: float | None = None) -> dict: ...
    def restore(self, link: str) -> dict: ...
