"""Typed channels between operator processes (docs/channels.md). Names load lazily, so importing
the package pulls in neither pyarrow nor grpc."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ChannelError": "errors",
    "ChannelTimeout": "errors",
    "ChannelAuthError": "errors",
    "ChannelCorrupt": "errors",
    "ChannelCancelled": "errors",
    "ChannelClosed": "errors",
    "Deadline": "deadline",
    "KVLayout": "kv_layout",
    "KVSource": "codec_kv",
    "encode_ipc": "codec_kv",
    "decode_ipc": "kv_landing",
    "Control": "token_ids.codec",
    "ControlKind": "token_ids.codec",
    "Message": "token_ids.codec",
    "TLSConfig": "security",
    "self_signed": "security",
    "EmulatedLink": "emulation",
    "WanFlightParams": "wan_flight.params",
    "WanFlightSender": "wan_flight.sender",
    "WanFlightReceiver": "wan_flight.receiver",
    "TransferReport": "transfer",
    "SharedMemoryKVParams": "rdma_tensor.protocol",
    "SharedMemoryKVSender": "rdma_tensor.sender",
    "SharedMemoryKVReceiver": "rdma_tensor.receiver",
    "TokenIdsParams": "token_ids.protocol",
    "TokenIdsClient": "token_ids.client",
    "TokenIdsServer": "token_ids.server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'pddflow.channels' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pddflow.channels.{mod}"), name)
