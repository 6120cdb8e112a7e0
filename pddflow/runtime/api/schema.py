"""OpenAI-compatible request bodies, validated strictly enough that a bad request gets a 400
naming the field, and loose enough that the official `openai` client's defaults pass."""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SEED_LIMIT = 1 << 63  # seeds are int64 on every leg (torch generators)
MAX_CHOICES = 16  # n: each choice is a flight of its own through the pipeline


class FieldError(ValueError):
    """A bad value, answered with a 400 whose `param` names its field (e.g. messages.0.content)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


_SCALARS = frozenset({int, float, bool, type(None)})


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
        items = value.items()
    elif isinstance(value, list):
        if _SCALARS.issuperset(map(type, value)):  # a prompt of token ids: no text in it
            return None
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        if not isinstance(item, (str, dict, list)) or (isinstance(item, str) and item.isascii()):
            bad = None
        else:
            bad = unpaired_surrogate(item, f"{path}.{key}" if path else str(key))
        if bad is None and isinstance(key, str) and not key.isascii():
            bad = unpaired_surrogate(key, path)
        if bad is not None:
            return bad
    return None


class Unsupported:
    """An OpenAI field pddflow does not implement: its neutral values (what a client sends when it
    does not use the feature) pass, anything else is a 400 naming the field."""

    def __init__(self, why: str, *neutral: Any):
        self.why, self.neutral = why, neutral


# field -> why it is refused unless neutral (docs/openai-api.md lists every field)
UNSUPPORTED_COMMON = {
    "logit_bias": Unsupported("logit bias is not implemented", None, {}),
    # vLLM's extensions that are not implemented (their defaults pass)
    "use_beam_search": Unsupported("beam search is not implemented", None, False),
    "length_penalty": Unsupported("length_penalty applies to beam search only", None, 1.0, 1),
    "prompt_logprobs": Unsupported("prompt log probabilities are not implemented", None),
    "truncate_prompt_tokens": Unsupported("prompts are not truncated", None),
    "bad_words": Unsupported("bad_words is not implemented", None, []),
    "allowed_token_ids": Unsupported("allowed_token_ids is not implemented", None),
    "logits_processors": Unsupported("custom logits processors are not loaded", None, []),
    "spaces_between_special_tokens": Unsupported(
        "special tokens are decoded by the tokenizer's own rule", None, True
    ),
    **{
        f"guided_{kind}": Unsupported("use response_format (json_schema or json_object)", None)
        for kind in ("json", "regex", "choice", "grammar")
    },
}
UNSUPPORTED_COMPLETION = {
    **UNSUPPORTED_COMMON,
    "echo": Unsupported("echo is not implemented", None, False),
    "suffix": Unsupported("insertion (suffix) is not implemented", None, ""),
}
UNSUPPORTED_CHAT = {
    **UNSUPPORTED_COMMON,
    "functions": Unsupported("the deprecated functions API: use tools", None, []),
    "function_call": Unsupported("the deprecated functions API: use tool_choice", None, "none"),
    "audio": Unsupported("audio output is not implemented", None),
    "modalities": Unsupported("only text output", None, ["text"]),
    "prediction": Unsupported("predicted outputs are not implemented", None),
    "reasoning_effort": Unsupported("the model does not reason", None),
    "verbosity": Unsupported("verbosity is not implemented", None),
    "web_search_options": Unsupported("web search is not implemented", None),
    "store": Unsupported("completions are not stored", None, False),
    "service_tier": Unsupported("there is one service tier", None, "auto", "default"),
}


def _neutral(value: Any, rule: Unsupported) -> bool:
    # type-exact: True == 1 and 0 == False in Python, not in this API
    return any(type(value) is type(n) and value == n for n in rule.neutral)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = Field(
        False, description="end the stream with a chunk holding the request's usage"
    )
    include_obfuscation: bool = Field(
        False, description="accepted and ignored: pddflow never pads its chunks"
    )
    continuous_usage_stats: bool = Field(
        False, description="vLLM's: with include_usage, every chunk carries the usage so far"
    )


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(max_length=64, description="the schema's name (OpenAI requires one)")
    description: str | None = None
    # "schema" shadows a BaseModel attribute: the field keeps its wire name by alias
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = Field(None, description="accepted: the output always follows the schema")


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise FieldError("response_format.json_schema", "required with type json_schema")
        if self.type != "json_schema" and self.json_schema is not None:
            raise FieldError("response_format.json_schema", "only with type json_schema")
        return self


class _Body(BaseModel):
    # strict: no coercion ("5" is no integer, true no seed); an unknown field is a 400 as well
    model_config = ConfigDict(extra="forbid", strict=True)
    unsupported: ClassVar[dict[str, Unsupported]] = {}

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        bad = unpaired_surrogate(data)
        if bad is not None:
            raise bad
        if isinstance(data, dict):
            data = dict(data)
            for name, rule in cls.unsupported.items():
                if name in data:
                    value = data.pop(name)
                    if not _neutral(value, rule):
                        raise FieldError(name, f"not supported: {rule.why}")
        return data

    model: str = Field(description="the served model's id (see /v1/models)")
    max_tokens: int | None = Field(None, ge=1, description="tokens to generate")
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="default 1")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="default 1")
    seed: int | None = Field(
        None,
        ge=0,
        lt=SEED_LIMIT,
        description="sampling seed: the same seed, prompt and parameters give the same tokens",
    )
    frequency_penalty: float | None = Field(
        None, ge=-2.0, le=2.0, description="minus this times each token's count in the output"
    )
    presence_penalty: float | None = Field(
        None, ge=-2.0, le=2.0, description="minus this for each token already in the output"
    )
    # vLLM's sampling extensions (the openai client's extra_body=...)
    repetition_penalty: float | None = Field(
        None, gt=0.0, le=10.0, description="a prompt or output token's logit / this (x if < 0)"
    )
    top_k: int | None = Field(None, ge=-1, description="keep the k most likely; -1 or 0: all")
    min_p: float | None = Field(
        None, ge=0.0, le=1.0, description="keep tokens at least this times the top one's odds"
    )
    # vLLM's output extensions (what `vllm bench serve` and agent clients send)
    ignore_eos: bool = Field(False, description="EOS does not end the output (max_tokens does)")
    min_tokens: int = Field(
        0, ge=0, description="no stop token or stop string ends the output before this many tokens"
    )
    stop_token_ids: list[int] | None = Field(
        None, max_length=256, description="token IDs that end the output as EOS does"
    )
    skip_special_tokens: bool = Field(True, description="false: special tokens appear as text")
    include_stop_str_in_output: bool = Field(
        False, description="a stop string that ends the output is part of its text"
    )
    response_format: ResponseFormat | None = Field(
        None, description="text (default), json_object, or json_schema: output that follows it"
    )
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(None, description="up to 4 strings, none empty")
    n: int | None = Field(
        None, ge=1, le=MAX_CHOICES, description="choices to generate, each its own sequence"
    )
    user: str | None = Field(None, description="accepted and ignored")
    # pddflow extensions (send with the openai client's extra_body=...)
    timeout_s: float | None = Field(
        None, gt=0, description="deadline for the whole request, seconds"
    )
    return_token_ids: bool = Field(False, description="include each choice's generated token IDs")
    variant: str | None = Field(
        None,
        max_length=200,
        description="force a pipeline variant (testing); default: the scheduler picks",
    )
    handoff: Literal["one_shot", "catch_up"] | None = Field(
        None, description="force the handoff mode (testing)"
    )

    @model_validator(mode="after")
    def _checks(self) -> _Body:
        if isinstance(self.stop, list):
            if len(self.stop) > 4:
                raise FieldError("stop", f"at most 4 stop strings, got {len(self.stop)}")
            for i, s in enumerate(self.stop):
                if not s:
                    raise FieldError(f"stop.{i}", "a stop string must not be empty")
        elif self.stop == "":
            raise FieldError("stop", "a stop string must not be empty")
        if self.stream_options is not None and not self.stream:
            raise FieldError("stream_options", "only allowed with stream: true")
        return self

    def sampling_fields(self) -> dict[str, Any]:
        """The penalties and filters as SamplingParams' fields (defaults where unset)."""
        return {
            "frequency_penalty": self.frequency_penalty or 0.0,
            "presence_penalty": self.presence_penalty or 0.0,
            "repetition_penalty": self.repetition_penalty or 1.0,
            "top_k": max(self.top_k or 0, 0),
            "min_p": self.min_p or 0.0,
        }

    def stop_ids(self, eos: tuple[int, ...], vocab_size: int) -> tuple[int, ...]:
        """The tokens that end the output: the model's EOS (unless ignore_eos) and
        stop_token_ids, each checked against the vocabulary."""
        for i, t in enumerate(self.stop_token_ids or []):
            if not 0 <= t < vocab_size:
                raise FieldError(
                    f"stop_token_ids.{i}",
                    f"token id {t} is outside the vocabulary [0, {vocab_size})",
                )
        ids = (() if self.ignore_eos else eos) + tuple(self.stop_token_ids or ())
        return tuple(dict.fromkeys(ids))

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        opts = self.stream_options
        return bool(self.include_usage and opts and opts.continuous_usage_stats)

    @property
    def candidates(self) -> int:
        """Sequences generated: n, or more that are ranked (completions' best_of)."""
        return self.n or 1

    def token_budget(self, room: int) -> int:
        """The tokens to generate; room: what the context has left after the prompt."""
        return self.max_tokens or 16

    @property
    def logprob_count(self) -> int | None:
        """None: no log probabilities; k: each token's and its k most likely alternatives'."""
        return None


class CompletionBody(_Body):
    unsupported: ClassVar[dict[str, Unsupported]] = UNSUPPORTED_COMPLETION
    prompt: str | list[int] | list[str] = Field(
        description="text, a list of token IDs, or a list of one text"
    )
    # 0 is no neutral value: it asks for the sampled tokens' log probabilities alone
    logprobs: int | None = Field(
        None, ge=0, le=5, description="each token's log probability and this many alternatives'"
    )

    best_of: int | None = Field(
        None,
        ge=1,
        le=MAX_CHOICES,
        description="candidates generated; the n with the highest log probability per token return",
    )

    @property
    def logprob_count(self) -> int | None:
        return self.logprobs

    @property
    def candidates(self) -> int:
        return max(self.best_of or 1, self.n or 1)

    @model_validator(mode="after")
    def _best_of(self) -> CompletionBody:
        n, best_of = self.n or 1, self.best_of
        if best_of is None or best_of == n:
            return self
        if best_of < n:
            raise FieldError("best_of", f"must be at least n ({n}), got {best_of}")
        if self.stream:
            raise FieldError(
                "best_of",
                "cannot be streamed: the best candidates are known only at the end "
                "(stream: false, or best_of equal to n)",
            )
        if self.temperature == 0:
            raise FieldError(
                "best_of", "greedy candidates are all the same: use temperature > 0 or best_of 1"
            )
        return self

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


class _StrictBody(BaseModel):
    # no coercion, no unknown field: a 400 naming the field instead
    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionCall(_StrictBody):
    name: str
    arguments: str = Field(description="JSON text")


class MessageToolCall(_StrictBody):
    """A call an assistant turn made (sent back in the conversation with its result)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    def for_template(self) -> dict[str, Any]:
        """transformers' shape: templates read `arguments` as a mapping (vLLM parses it too)."""
        try:
            args: Any = json.loads(self.function.arguments)
        except json.JSONDecodeError:
            args = self.function.arguments
        fn = {"name": self.function.name, "arguments": args}
        return {"id": self.id, "type": "function", "function": fn}


TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"


class FunctionDef(_StrictBody):
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema of the arguments")
    strict: bool | None = Field(None, description="accepted: forced calls always fit the schema")


class Tool(_StrictBody):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_StrictBody):
    name: str


class NamedToolChoice(_StrictBody):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = Field(None, description="passed to the chat template")
    tool_call_id: str | None = Field(None, description="a tool result's call (role tool)")
    tool_calls: list[MessageToolCall] | None = Field(None, description="an assistant's calls")
    function_call: None = None
    refusal: str | None = Field(None, description="accepted and ignored")

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
    unsupported: ClassVar[dict[str, Unsupported]] = UNSUPPORTED_CHAT
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(
        None, ge=1, description="tokens to generate (takes precedence over max_tokens)"
    )
    metadata: dict[str, str] | None = Field(None, description="accepted and ignored")
    tools: list[Tool] | None = Field(None, max_length=128, description="functions it may call")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="default auto with tools, none without"
    )
    parallel_tool_calls: bool | None = Field(None, description="several calls in one turn")
    prompt_cache_key: str | None = Field(
        None, description="accepted and ignored: requests are routed by their prefix anyway"
    )
    safety_identifier: str | None = Field(None, description="accepted and ignored")
    logprobs: bool | None = Field(None, description="return each output token's log probability")
    top_logprobs: int | None = Field(
        None, ge=0, le=20, description="with logprobs: this many most likely tokens per position"
    )

    @property
    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def tool_mode(self) -> str:
        """none, auto, required, or the named function's name."""
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            return choice.function.name
        return choice or ("auto" if self.tools else "none")

    @model_validator(mode="after")
    def _tools(self) -> ChatBody:
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) < len(names):
            raise FieldError("tools", "two tools have the same name")
        if self.tool_choice not in (None, "none") and not self.tools:
            raise FieldError("tool_choice", "only allowed when tools are given")
        mode = self.tool_mode
        if mode not in ("none", "auto", "required") and mode not in names:
            raise FieldError("tool_choice.function.name", f"no tool named {mode!r} in tools")
        if self.response_format is not None and self.response_format.type != "text":
            if mode not in ("none", "auto"):
                raise FieldError("tool_choice", "a forced tool call and a response_format clash")
        return self

    @model_validator(mode="after")
    def _contents(self) -> ChatBody:
        if self.top_logprobs and not self.logprobs:
            raise FieldError("top_logprobs", "only with logprobs: true")
        for i, m in enumerate(self.messages):
            if m.content is None and m.role != "assistant":
                raise FieldError(f"messages.{i}.content", f"a {m.role} message needs content")
            for j, part in enumerate(m.content if isinstance(m.content, list) else []):
                where = f"messages.{i}.content.{j}"
                if part.get("type") != "text":
                    kind = str(part.get("type"))[:40]
                    raise FieldError(
                        f"{where}.type", f"only text content parts are supported, not {kind!r}"
                    )
                if not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
                    raise FieldError(where, 'a text part is {"type": "text", "text": STRING}')
        return self

    def token_budget(self, room: int) -> int:
        # OpenAI's chat default: as many as the context has room for
        return self.max_completion_tokens or self.max_tokens or max(room, 1)
