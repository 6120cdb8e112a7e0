"""One API process of several (`deploy --api-servers N`): the OpenAI API on the deployment's
listening socket (inherited; the kernel hands each connection to one of the processes), its
requests routed by the deployment's router (remote_router.py), their tokens streamed here by the
workers. The deployer starts it; it dies with the deployer.

python -m pddflow.runtime.api.api_process WIRING NAME --fd N --router-http URL [...]
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pddflow.core.parent_death import die_with_parent
from pddflow.core.startup_gc import starting

if TYPE_CHECKING:
    from pddflow.runtime.api.remote_router import RemoteRouter
    from pddflow.runtime.api.shutdown import DrainingServer


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    ap = argparse.ArgumentParser(prog="python -m pddflow.runtime.api.api_process")
    ap.add_argument("wiring", type=Path)
    ap.add_argument("name")
    ap.add_argument("--fd", type=int, required=True, help="the listening socket's descriptor")
    ap.add_argument("--router-http", required=True, help="the router's internal HTTP address")
    ap.add_argument("--stream-interval", type=int, default=1)
    ap.add_argument("--chat-template", type=Path)
    ap.add_argument("--modeled", action="store_true", help="the modeled engine's context")
    ap.add_argument("--drain-timeout", type=float, default=30.0)
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format=f"{args.name} %(name)s: %(message)s")

    with starting():  # its imports and its app
        server, router = _server(args)
    sock = socket.socket(fileno=args.fd)
    try:
        server.run(sockets=[sock])
    finally:
        router.close()
    return 0


def _server(args: argparse.Namespace) -> tuple[DrainingServer, RemoteRouter]:
    """The process's server and router, built (imports included) before it serves."""
    import uvicorn

    from pddflow.runtime.api.admission import Admission
    from pddflow.runtime.api.app import make_app
    from pddflow.runtime.api.remote_router import RemoteRouter
    from pddflow.runtime.api.shutdown import DrainingServer
    from pddflow.runtime.frontend.model_info import model_info
    from pddflow.runtime.wiring import Wiring

    wiring = Wiring.load(args.wiring)
    plan = wiring.plan()
    model = model_info(plan.model.weights, args.chat_template)
    if args.modeled:  # the arch's context, not the tokenizer model's (as the deployer's)
        from dataclasses import replace

        model = replace(model, max_context=plan.model.max_context)
    router = RemoteRouter(wiring, args.name, model, args.stream_interval)
    keys = _keys()
    admission = Admission()
    app = make_app(
        router,
        admission,
        api_key=keys.get("api_key"),
        admin_key=keys.get("admin_key"),
        forward=args.router_http,
    )
    config = uvicorn.Config(
        app, log_level=args.log_level, access_log=False, timeout_graceful_shutdown=5
    )
    return DrainingServer(config, admission, args.drain_timeout, say=lambda _: None), router


def _keys() -> dict[str, str]:
    """The API and admin keys, from the environment (not the command line: `ps` shows that)."""
    import os

    return {
        k: v
        for k, v in (
            ("api_key", os.environ.get("PDDFLOW_API_KEY", "")),
            ("admin_key", os.environ.get("PDDFLOW_ADMIN_KEY", "")),
        )
        if v
    }


if __name__ == "__main__":
    sys.exit(main())
