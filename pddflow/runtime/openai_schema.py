"""OpenAI-compatible request bodies, validated strictly enough that a bad request gets a 400
naming the field, and loose enough that the official `openai` client's defaults pass."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SEED_LIMIT = 1 << 63  # seeds are int64 on every leg (torch generators)


class FieldError(ValueError):
    """A bad value, answered with a 400 whose `param` names its field (e.g. messages.0.content)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def unpaired_surrogate(value: Any, path: str = "") -> FieldError | None:
    """The first string (or key) in a parsed JSON body holding a lone UTF-16 surrogate: JSON lets
    "\\ud800" through, but it is no character, so it cannot be tokenized or sent back."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            code = ord(value[exc.start])
            return FieldError(
                path or "body",
                f"unpaired surrogate U+{code:04X} at character {exc.start}: text must be valid "
                "Unicode (a surrogate pair's two halves must come together)",
            )
        return None
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return None
    for key, item in items:
        where = f"{path}.{key}" if path else str(key)
        bad = unpaired_surrogate(key, path) if isinstance(key, str) else None
        bad = bad or unpaired_surrogate(item, where)
        if bad is not None:
            return bad
    return None


class _Body(BaseModel):
    # The openai client sends fields we do not use (user, logit_bias, ...): accept, ignore.
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        bad = unpaired_surrogate(data)
        if bad is not None:
            raise bad
        return data

    model: str = Field(description="the served model's id (see /v1/models)")
    max_tokens: int | None = Field(None, ge=1, description="tokens to generate (default 16)")
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(
        None,
        ge=0,
        lt=SEED_LIMIT,
        strict=True,  # an integer in [0, 2^63): not a bool, a float or a string
        description="sampling seed: the same seed, prompt and parameters give the same tokens",
    )
    stream: bool = False
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1, description="only one choice per request")
    # pddflow extensions (send with the openai client's extra_body=...)
    timeout_s: float | None = Field(
        None, gt=0, description="deadline for the whole request, seconds"
    )
    return_token_ids: bool = Field(False, description="include each choice's generated token IDs")
    variant: str | None = Field(
        None, description="force a pipeline variant (testing); default: the scheduler picks"
    )
    handoff: Literal["one_shot", "catch_up"] | None = Field(
        None, description="force the handoff mode (testing)"
    )

    def token_budget(self, default: int = 16) -> int:
        return self.max_completion_tokens or self.max_tokens or default


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] = Field(description="text, or a list of token IDs")

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionBody:
        if isinstance(self.prompt, list):
            if not self.prompt:
                raise FieldError("prompt", "must not be empty")
            if isinstance(self.prompt[0], str):
                if len(self.prompt) != 1:
                    raise FieldError(
                        "prompt",
                        "one prompt per request (a list of several strings is not supported)",
                    )
                self.prompt = self.prompt[0]
        if isinstance(self.prompt, str) and not self.prompt:
            raise FieldError("prompt", "must not be empty")
        return self


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise ValueError(f"only text content is supported, got a {part.get('type')!r} part")
            parts.append(str(part.get("text", "")))
        return "".join(parts)


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)


def render_chat(messages: list[ChatMessage]) -> str:
    """A plain chat template for models without one of their own: one block per turn, ending
    with an open assistant turn."""
    out = [f"<|{m.role}|>\n{m.text()}\n" for m in messages]
    return "".join(out) + "<|assistant|>\n"
