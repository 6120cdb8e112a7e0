"""API keys: a bearer key for /v1/* and another for /admin/*, compared in constant time."""

from __future__ import annotations

import hmac
from typing import Any

from pddflow.runtime.api.errors import error_response


class KeyGuard:
    """Bearer keys (compared in constant time): `api_key` guards /v1/*, `admin_key` /admin/*;
    /health and /metrics stay open. A pure ASGI layer: it leaves the body and the disconnect
    watch to the endpoints."""

    def __init__(self, app: Any, api_key: str | None, admin_key: str | None):
        self.app, self.api_key, self.admin_key = app, api_key, admin_key

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            key = (
                self.api_key
                if path.startswith("/v1/") or path == "/v1"
                else self.admin_key
                if path.startswith("/admin/")
                else None
            )
            if key is not None and not _bearer_matches(scope, key):
                given = any(k == b"authorization" for k, _ in scope["headers"])
                out = error_response(
                    401,
                    "invalid API key"
                    if given
                    else "missing API key: send 'Authorization: Bearer "
                    "<key>' (pddflow deploy --api-key; --admin-key for /admin)",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await out(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _bearer_matches(scope: Any, key: str) -> bool:
    got = b""
    for k, v in scope["headers"]:
        if k == b"authorization":
            got = v
    scheme, _, token = got.partition(b" ")
    if scheme.lower() != b"bearer":
        token = b""
    return hmac.compare_digest(token.strip(), key.encode())
