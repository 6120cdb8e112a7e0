"""The API's errors: the OpenAI error shape, of bounded size whatever the request held, and the
400 a malformed body gets, naming its field."""

from __future__ import annotations

import re

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from pddflow.runtime.api.schema import FieldError

MESSAGE_LIMIT = 1000  # characters of an error message: echoed input is cut, never sent back whole


def error_response(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | int | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """The OpenAI error shape, of bounded size whatever the request held."""
    return JSONResponse(
        {
            "error": {
                "message": _cut(message, MESSAGE_LIMIT),
                "type": kind,
                "param": None if param is None else _cut(param, 200),
                "code": code,
            }
        },
        status_code=status,
        headers=headers,
    )


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[: limit - 40]}... ({len(text)} characters)"


def short_repr(value: str, limit: int = 100) -> str:
    """repr of a client's string, cut to `limit` characters."""
    return repr(_cut(value, limit))


# pydantic's union members in an error's location ("str", "list[int]", "function-after[...]")
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|[\w-]+\[.*\])$")


# what a field that takes several forms takes, for an error that matched none of them
_UNION_FORMS = {
    "prompt": "a string, a list of token IDs, or a list of one string",
    "stop": "a string or a list of up to 4 strings",
    "messages.N.content": "a string, a list of content parts, or null (assistant only)",
}


def validation_error(exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0]
    named = (first.get("ctx") or {}).get("error")
    if isinstance(named, FieldError):
        return error_response(400, str(named), param=named.field)
    if first["type"] == "json_invalid":
        pos = first["loc"][-1]
        why = (first.get("ctx") or {}).get("error", "")
        return error_response(400, f"the body is not valid JSON ({why}, at character {pos})")
    loc = [p for p in first["loc"] if p != "body"]
    kept = [p for p in loc if not (isinstance(p, str) and _TYPE_TAG.match(p))]
    where = ".".join(str(p) for p in kept)
    form = _UNION_FORMS.get(".".join("N" if isinstance(p, int) else str(p) for p in kept))
    if first["type"] == "extra_forbidden":
        msg = "unknown field: not an OpenAI request field this server takes (docs/openai-api.md)"
    elif form is not None and len(kept) < len(loc):  # no member of a union matched
        msg = f"must be {form}"
    elif not where and first["type"] == "model_attributes_type":
        msg = "the body must be a JSON object (sent as Content-Type: application/json)"
    else:
        msg = first["msg"]
    return error_response(400, f"{where}: {msg}" if where else msg, param=where or None)
