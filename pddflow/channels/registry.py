"""Transport implementations of the channel kinds declared in `pddflow.core.channel_kinds`.

The core registry says what a kind carries, how far it reaches and which params a graph edge may
set; this one says how to open its two ends. The runtime wires an edge of the compiled Plan with:

    impl = TRANSPORTS.get("wan_flight")
    params = impl.make_params(edge.params, tls=deployment_tls, link=plan_link_if_same_host)
    rx = impl.receiver(params)                 # on the receiving worker; publish rx.address
    tx = impl.sender(rx.address, params)       # on the sending worker

Graph params are the core kind's (`tls: true`, `token: ""`, `emulate: true`, ...); make_params
turns them into the transport's params dataclass, taking the TLS material and the LinkModel from
the runtime. Plugins add implementations through the `pddflow.channel_transports` entry-point
group (a function that receives this registry), next to their kind in `pddflow.channels`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pddflow.core.registry import Registry, did_you_mean


@dataclass(frozen=True)
class ChannelTransport:
    name: str  # the channel kind it implements
    params_type: type
    receiver: Callable[..., Any]  # (params, **kw) -> receiver with .address
    sender: Callable[..., Any]  # (address, params, **kw) -> sender

    def make_params(
        self, raw: dict | Any | None = None, *, tls: Any = None, link: Any = None
    ) -> Any:
        """Params from a graph edge's mapping (an instance is returned as is).

        tls: the deployment's TLSConfig, used when the edge says `tls: true`.
        link: the LinkModel to emulate when the edge says `emulate: true` (pass None when the two
        ends are really apart: then nothing is shaped)."""
        if raw is None:
            raw = {}
        if isinstance(raw, self.params_type):
            return raw
        return _coerce(self.name, self.params_type, dict(raw), tls, link)


def _coerce(kind: str, cls: type, raw: dict, tls: Any, link: Any) -> Any:
    from pddflow.channels.emulation import link_from_params
    from pddflow.channels.security import TLSConfig
    from pddflow.core.link import LinkModel

    names = {f.name for f in dataclasses.fields(cls)}
    valid = sorted(names | ({"token_env"} if "token" in names else set()))
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in valid:
            raise ValueError(
                f"{kind}: unknown channel param {key!r}{did_you_mean(key, valid)}; valid: {', '.join(valid)}"
            )
        if key == "token_env":  # keep secrets out of the graph file
            if value not in os.environ:
                raise ValueError(
                    f"{kind}: token_env names {value!r}, which is not set in the environment"
                )
            out["token"] = os.environ[value]
        elif key == "token":
            out["token"] = value or None  # "" means no auth (loopback only)
        elif key == "tls":
            if value is True:
                if tls is None:
                    raise ValueError(
                        f"{kind}: tls is on but the deployment provides no certificates "
                        "(pass a TLSConfig; pddflow.channels.security.self_signed makes one)"
                    )
                value = tls
            elif value in (None, False):
                value = None
            elif isinstance(value, dict):
                value = TLSConfig(**value)
            out["tls"] = value
        elif key == "emulate":
            if value is True:
                value = link
            elif value in (None, False):
                value = None
            elif not isinstance(value, LinkModel):
                value = link_from_params(value, name=f"{kind}-link")
            out["emulate"] = value
        else:
            out[key] = value
    return cls(**out)


def _builtin(reg: Registry[ChannelTransport]) -> None:
    def wan_rx(params: Any, **kw: Any) -> Any:
        from pddflow.channels.wan_flight import WanFlightReceiver

        return WanFlightReceiver(params=params, **kw)

    def wan_tx(address: str, params: Any, **kw: Any) -> Any:
        from pddflow.channels.wan_flight import WanFlightSender

        return WanFlightSender(address, params=params, **kw)

    def rdma_rx(params: Any, **kw: Any) -> Any:
        from pddflow.channels.rdma_tensor import RdmaTensorReceiver

        return RdmaTensorReceiver(params=params, **kw)

    def rdma_tx(address: str, params: Any, **kw: Any) -> Any:
        from pddflow.channels.rdma_tensor import RdmaTensorSender

        return RdmaTensorSender(address, params=params, **kw)

    def tok_rx(params: Any, **kw: Any) -> Any:
        from pddflow.channels.token_ids import TokenIdsServer

        return TokenIdsServer(params=params, **kw)

    def tok_tx(address: str, params: Any, **kw: Any) -> Any:
        from pddflow.channels.token_ids import TokenIdsClient

        return TokenIdsClient(address, params=params, **kw)

    from pddflow.channels.rdma_tensor import RdmaTensorParams
    from pddflow.channels.token_ids import TokenIdsParams
    from pddflow.channels.wan_flight import WanFlightParams

    reg.register("rdma_tensor", ChannelTransport("rdma_tensor", RdmaTensorParams, rdma_rx, rdma_tx))
    reg.register("wan_flight", ChannelTransport("wan_flight", WanFlightParams, wan_rx, wan_tx))
    reg.register("token_ids", ChannelTransport("token_ids", TokenIdsParams, tok_rx, tok_tx))


TRANSPORTS: Registry[ChannelTransport] = Registry("channel transport", "pddflow.channel_transports")
_builtin(TRANSPORTS)
