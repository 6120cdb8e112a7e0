"""Log probabilities in the OpenAI shapes of /v1/completions and /v1/chat/completions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pddflow.core.payloads import TokenLogprob


def token_text(tokenizer: Any, token_id: int) -> tuple[str, list[int]]:
    """One token's text (the tokenizer's decode of it alone) and bytes. A byte tokenizer's id may
    be partial UTF-8: then the bytes are the raw ones and the text has replacement characters, as
    OpenAI reports them."""
    text = tokenizer.decode([token_id])
    raw_of = getattr(tokenizer, "token_bytes", None)
    if raw_of is not None:
        return text, list(raw_of(token_id))
    return text, list(text.encode("utf-8"))


def completion_logprobs(
    tokenizer: Any, ids: Sequence[int], lps: Sequence[TokenLogprob | None], offset: int
) -> tuple[dict[str, Any], int]:
    """/v1/completions' `logprobs` for `ids` whose text starts at character `offset` of the
    output, and the offset after them. top_logprobs holds the k most likely tokens and the sampled
    one (vLLM's shape: k+1 entries when the sampled token is not among them)."""
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    out: dict[str, Any] = {k: [] for k in keys}
    for tok, lp in zip(ids, lps):
        text = token_text(tokenizer, tok)[0]
        out["tokens"].append(text)
        out["text_offset"].append(offset)
        offset += len(text)
        if lp is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(lp.logprob)
        top = {token_text(tokenizer, i)[0]: v for i, v in lp.top}
        top.setdefault(text, lp.logprob)
        out["top_logprobs"].append(top)
    return out, offset


def chat_logprobs(
    tokenizer: Any, ids: Sequence[int], lps: Sequence[TokenLogprob | None]
) -> dict[str, Any]:
    """/v1/chat/completions' `logprobs` for `ids`: top_logprobs holds exactly the k asked for."""
    content = []
    for tok, lp in zip(ids, lps):
        text, raw = token_text(tokenizer, tok)
        entry: dict[str, Any] = {"token": text, "logprob": None, "bytes": raw, "top_logprobs": []}
        if lp is not None:
            entry["logprob"] = lp.logprob
            for i, v in lp.top:
                t, b = token_text(tokenizer, i)
                entry["top_logprobs"].append({"token": t, "logprob": v, "bytes": b})
        content.append(entry)
    return {"content": content}
