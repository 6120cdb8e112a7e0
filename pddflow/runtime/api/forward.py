"""An API process's deployment-wide endpoints (`deploy --api-servers N`): /health, /metrics, a
request's timeline and the admin endpoints answer for the whole deployment, so they are the
router's, asked over HTTP on its internal address."""

from __future__ import annotations

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from pddflow.runtime.api.errors import error_response

HOP_HEADERS = ("content-type", "retry-after")  # what an answer keeps of the router's
ASKED_WITH = ("authorization", "content-type")  # and a question of the client's


class RouterHttp:
    def __init__(self, base: str, timeout_s: float = 30.0):
        self.base = base.rstrip("/")
        self._client: httpx.AsyncClient | None = None
        self.timeout_s = timeout_s

    async def ask(self, request: Request, extra: bytes = b"") -> Response:
        """`request` as the router answers it (its status, body and content type); `extra`
        follows the body (this process's own metrics)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        headers = {
            k: v for k, v in request.headers.items() if k in ("authorization", "content-type")
        }
        try:
            r = await self._client.request(
                request.method,
                self.base + request.url.path,
                params=request.query_params,
                content=await request.body(),
                headers=headers,
            )
        except httpx.HTTPError as exc:
            return error_response(
                503, f"the deployment's router did not answer: {exc}", kind="server_error"
            )
        kept = {k: v for k, v in r.headers.items() if k in HOP_HEADERS}
        return Response(r.content + extra, status_code=r.status_code, headers=kept)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def add_admin_forward(app: FastAPI, router: RouterHttp) -> None:
    """Every /admin/... call, answered by the router (links, pools)."""

    @app.api_route("/admin/{path:path}", methods=["GET", "POST"])
    async def admin(path: str, request: Request) -> Response:
        return await router.ask(request)
