"""A checkpoint's chat template (`chat_template.jinja` or `tokenizer_config.json`'s
`chat_template`, or `deploy --chat-template FILE`) rendered as transformers' `apply_chat_template`
renders it: a sandboxed jinja2 environment with the same globals and filters, so a prompt here is
token for token the prompt transformers builds."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from pddflow.core.model_config import ModelSpecError


class ChatTurn(Protocol):
    """One message of a conversation as the API parsed it (`api.schema.ChatMessage`)."""

    role: str
    content: Any  # a string, a list of parts, or None (a tool-call turn)
    model_extra: dict[str, Any] | None  # the fields a template may read beyond role and content

    def text(self) -> str: ...


def render_chat(messages: list[ChatTurn], tools: list[dict[str, Any]] | None = None) -> str:
    """A plain chat template for models without one of their own: the tools first (one JSON
    per line), one block per turn (an assistant's calls in the hermes format), ending with an
    open assistant turn."""
    out = ["<|tools|>\n" + "".join(json.dumps(t) + "\n" for t in tools)] if tools else []
    for m in messages:
        calls = getattr(m, "tool_calls", None) or []
        blocks = "".join(
            f"<tool_call>\n{json.dumps(c.for_template()['function'])}\n</tool_call>\n"
            for c in calls
        )
        out.append(f"<|{m.role}|>\n{m.text()}\n{blocks}")
    return "".join(out) + "<|assistant|>\n"


def template_turn(m: ChatTurn) -> dict[str, Any]:
    """A message as transformers hands it to a template: content as the client sent it when
    absent (templates test for None), an assistant's calls with their arguments as a mapping."""
    turn: dict[str, Any] = {
        **(m.model_extra or {}),
        "role": m.role,
        "content": None if m.content is None else m.text(),
    }
    for key in ("name", "tool_call_id"):
        if (value := getattr(m, key, None)) is not None:
            turn[key] = value
    if calls := getattr(m, "tool_calls", None):
        turn["tool_calls"] = [c.for_template() for c in calls]
    return turn


# how a model writes a tool call (api/tools.py has the grammars and the parsers)
HERMES, MISTRAL, LLAMA3 = "hermes", "mistral", "llama3"


def tool_format(template: str | None) -> str:
    """The tool-call format a chat template's model writes (hermes without a template)."""
    if template is None or "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or "parameters" in template:
        return LLAMA3
    return HERMES


class ChatTemplateError(ValueError):
    """A template that refused the conversation (`raise_exception`) or failed rendering: a 400."""


def _special(value: Any) -> str | None:
    # tokenizer_config.json writes special tokens as strings or as serialised AddedTokens
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def find_template(path: Path) -> tuple[str | None, dict[str, str]]:
    """The checkpoint directory's template (None if it has none) and its special-token strings."""
    specials: dict[str, str] = {}
    template: str | None = None
    cfg_file = path / "tokenizer_config.json"
    if cfg_file.is_file():
        try:
            cfg = json.loads(cfg_file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelSpecError(f"{cfg_file}: cannot parse: {exc}") from None
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            if (tok := _special(cfg.get(key))) is not None:
                specials[key] = tok
        raw = cfg.get("chat_template")
        if isinstance(raw, list):  # named templates: transformers uses "default"
            named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
            raw = named.get("default")
        if isinstance(raw, str):
            template = raw
    jinja_file = path / "chat_template.jinja"  # where transformers >= 4.50 saves it; it wins
    if jinja_file.is_file():
        template = jinja_file.read_text()
    return template, specials


class ChatTemplate:
    def __init__(self, source: str, specials: dict[str, str], origin: str):
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class _Generation(Extension):
            # `{% generation %}` marks assistant text for training masks; rendering keeps the body
            tags = {"generation"}

            def parse(self, parser: Any) -> list[nodes.Node]:
                next(parser.stream)
                return parser.parse_statements(("name:endgeneration",), drop_needle=True)

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            # jinja's own tojson escapes HTML characters, which would change the prompt
            return json.dumps(
                x,
                ensure_ascii=ensure_ascii,
                indent=indent,
                separators=separators,
                sort_keys=sort_keys,
            )

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_Generation, "jinja2.ext.loopcontrols"],
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ModelSpecError(
                f"chat template from {origin}: line {exc.lineno}: {exc.message}"
            ) from None
        self._errors = (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError)
        self.specials = specials
        self.origin = origin
        self.source = source

    def __call__(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        return self.render(messages, tools)

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=True,
                tools=tools,
                documents=None,
                **self.specials,
            )
        except self._errors as exc:
            raise ChatTemplateError(f"chat template: {exc}") from None


def load_chat_renderer(path: Path | None, override: Path | None) -> ChatTemplate | None:
    """`override` (a jinja file) or the checkpoint's own template; None when there is neither."""
    source, specials = find_template(path) if path is not None else (None, {})
    origin = str(path) if path is not None else ""
    if override is not None:
        try:
            source, origin = Path(override).read_text(), str(override)
        except OSError as exc:
            raise ModelSpecError(f"--chat-template {override}: {exc.strerror}") from None
    if source is None:
        return None
    return ChatTemplate(source, specials, origin)
