"""The admin endpoints on the emulated WAN (docs/runtime.md, Admin endpoints): cut a link (the
backend's relays, where it has them) and degrade or restore it (the workers' senders), through the
deployment's `LinkControl`; and live scaling of a pool (`POST /admin/pools/{operator}`). They exist
only with an admin key; `KeyGuard` checks it before any of them runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from pddflow.runtime.api.errors import error_response
from pddflow.runtime.api.router import LinkControl
from pddflow.runtime.frontend.link_admin import LinkNotEmulated, LinkNotFound, LinkTuneFailed


class LinkCut(BaseModel):
    seconds: float = Field(gt=0, le=3600, description="how long the link stays down")
    after_bytes: int = Field(
        0, ge=0, description="cut once this many more bytes crossed it (mid-transfer)"
    )


class LinkPartition(BaseModel):
    seconds: float = Field(gt=0, le=3600, description="how long the impairment lasts")
    loss: float = Field(
        1.0,
        gt=0,
        le=1,
        description="the share of what is sent that is lost: 1 (default) is a partition, "
        "anything less a lossy link (each loss costs TCP's retransmission timeout)",
    )
    from_cluster: str | None = Field(
        None, description="only what this end of the link sends (a one-way split); default both"
    )


class LinkDegrade(BaseModel):
    gbps: float = Field(gt=0, le=1e5, description="the link's new bandwidth")
    jitter_p99_ms: float | None = Field(
        None,
        ge=0,
        le=600_000,
        description="the jitter's new P99 (its distribution and tail shape as declared); "
        "absent: the declared jitter",
    )


class PoolSize(BaseModel):
    replicas: int = Field(ge=1, description="instances of the operator to run")


# (operator, replicas) -> the pool's state; raises an exception with `status` (ScaleError)
Scaler = Callable[[str, int], dict[str, Any]]


def add_pool_routes(app: FastAPI, scale: Scaler) -> None:
    @app.post("/admin/pools/{operator}")
    async def scale_pool(operator: str, body: PoolSize) -> JSONResponse:
        """Live scaling: start or drain-and-stop instances until `replicas` run; answers when
        done (starting waits for the new instance to be ready)."""
        try:
            return JSONResponse(await asyncio.to_thread(scale, operator, body.replicas))
        except Exception as exc:  # noqa: BLE001 - ScaleError carries its status
            status = getattr(exc, "status", None)
            if status is None:
                raise
            kind = "not_found_error" if status == 404 else None
            args = {"kind": kind, "param": "operator"} if kind else {}
            return error_response(status, str(exc), **args)


def add_admin_routes(app: FastAPI, links: LinkControl) -> None:
    if links.can_cut():

        @app.post("/admin/links/{name}/cut")
        async def cut_link(name: str, body: LinkCut) -> JSONResponse:
            return await _tune(lambda: links.cut(name, body.seconds, body.after_bytes))

        @app.post("/admin/links/{name}/partition")
        async def partition_link(name: str, body: LinkPartition) -> JSONResponse:
            return await _tune(
                lambda: links.partition(name, body.seconds, body.loss, body.from_cluster)
            )

    @app.post("/admin/links/{name}/degrade")
    async def degrade_link(name: str, body: LinkDegrade) -> JSONResponse:
        # the workers' answers are awaited off the event loop: streams go on meanwhile
        return await _tune(lambda: links.degrade(name, body.gbps, body.jitter_p99_ms))

    @app.post("/admin/links/{name}/restore")
    async def restore_link(name: str) -> JSONResponse:
        return await _tune(lambda: links.restore(name))


async def _tune(call: Any) -> JSONResponse:
    try:
        return JSONResponse(await asyncio.to_thread(call))
    except LinkNotFound as exc:
        return error_response(404, str(exc.args[0]), kind="not_found_error", param="name")
    except LinkNotEmulated as exc:
        return error_response(409, str(exc), param="name")
    except ValueError as exc:
        return error_response(400, str(exc))
    except LinkTuneFailed as exc:
        return error_response(502, str(exc), kind="server_error")
