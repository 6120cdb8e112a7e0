"""What both ends of a token_ids channel agree on: the gRPC method, the protocol version, the
params and the gRPC options they imply, and how a failed call reads as a channel error."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from pddflow.channels.errors import ChannelAuthError, ChannelClosed, ChannelError, ChannelTimeout
from pddflow.channels.security import TLSConfig
from pddflow.core.link import LinkModel

SERVICE = "pddflow.channels.v1.TokenIdsChannel"
METHOD = f"/{SERVICE}/Stream"
VERSION = 1


@dataclass(frozen=True)
class TokenIdsParams:
    """Channel params a graph edge passes (`channel: token_ids`)."""

    deadline_s: float = 5.0
    token: str | None = None
    tls: TLSConfig | None = None
    keepalive_s: float = 30.0
    max_message_bytes: int = 4 << 20
    emulate: LinkModel | None = None
    seed: int = 0
    max_streams: int = 64  # server: concurrent peers


def grpc_options(params: TokenIdsParams, server: bool) -> list[tuple[str, int]]:
    keepalive_ms = int(params.keepalive_s * 1000)
    opts = [
        ("grpc.max_send_message_length", params.max_message_bytes),
        ("grpc.max_receive_message_length", params.max_message_bytes),
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if server:
        opts += [
            # accept the client's keepalive pings rather than answering them with GOAWAY
            ("grpc.http2.min_ping_interval_without_data_ms", max(1000, keepalive_ms // 2)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.so_reuseport", 0),
        ]
    else:
        opts += [
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.use_local_subchannel_pool", 1),
        ]
    return opts


def rpc_error(exc: grpc.RpcError, target: str) -> ChannelError:
    """A failed gRPC stream as the channel error a caller can act on."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return ChannelAuthError(f"token_ids server at {target} refused our credentials: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ChannelTimeout(f"token_ids {target}: {details}")
    return ChannelClosed(
        f"token_ids stream to {target} ended: {code.name if code else ''} {details}"
    )
