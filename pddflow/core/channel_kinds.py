"""Channel kinds: what each carries (`carries`) and how far it reaches (`scope`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pddflow.core.operator_types import Param
from pddflow.core.payloads import Payload
from pddflow.core.registry import Registry


@dataclass(frozen=True)
class ChannelKind:
    name: str
    help: str
    carries: frozenset[Payload]
    scope: str  # "process" | "cluster" (both ends in one cluster) | "any" (may cross a link)
    params: dict[str, Param] = field(default_factory=dict)

    def can_cross_clusters(self) -> bool:
        return self.scope == "any"


CHANNEL_KINDS: Registry[ChannelKind] = Registry("channel kind", "pddflow.channels")


class Kind(enum.StrEnum):
    """The built-in kinds, the ones the runtime's transports implement (a plugin kind is a
    declaration `validate`, `plan` and `simulate` use: docs/plugins.md)."""

    LOCAL = "local"
    RDMA_TENSOR = "rdma_tensor"
    WAN_FLIGHT = "wan_flight"
    TOKEN_IDS = "token_ids"


_TLS = Param(bool, False, "encrypt with TLS (certificates from the deployment's tls section)")
_TOKEN = Param(str, "", "bearer token the receiver requires; empty = no auth (loopback only)")
_DEADLINE = Param(float, 30.0, "seconds a transfer may take before it fails and cancels its pair")
# per-block KV checksums (pddflow/channels/kv_checksum.py implements each)
CHECKSUM_ALGORITHMS = ("xxh3_64", "crc32")

for _k in (
    ChannelKind(
        Kind.LOCAL,
        "in-process queue (tests and single-process deployments)",
        frozenset(Payload),
        "process",
    ),
    ChannelKind(
        Kind.RDMA_TENSOR,
        "KV blocks inside a cluster: shared memory on one host, else NIXL/UCX where installed, "
        "else TCP",
        frozenset({Payload.KV_BLOCKS}),
        "cluster",
        {
            "ring_slots": Param(int, 4, "buffers in the shared-memory ring"),
            "slot_mb": Param(
                float, 2.0, "size of one ring buffer in MiB (small rings stay in cache)"
            ),
            "arena_mb": Param(
                float, 512.0, "direct-landing arena per receiver, MiB (0: ring only)"
            ),
            "checksum": Param(
                str,
                "auto",
                "per-block checksum: auto (off over shared memory, which has no wire to corrupt; "
                "xxh3_64 over tcp or nixl), '' (off), xxh3_64 or crc32",
                ("auto", "", *CHECKSUM_ALGORITHMS),
            ),
            "transport": Param(
                str,
                "auto",
                "auto (shared memory when both ends share a host, else nixl where installed, "
                "else tcp), shm (ends kept on one host), tcp or nixl",
                ("auto", "shm", "tcp", "nixl"),
            ),
            "deadline_s": _DEADLINE,
        },
    ),
    ChannelKind(
        Kind.WAN_FLIGHT,
        "KV blocks across clusters: Arrow Flight over gRPC/TCP, parallel streams, resumable",
        frozenset({Payload.KV_BLOCKS}),
        "any",
        {
            "streams": Param(int, 4, "parallel Flight streams per transfer"),
            "checksum": Param(
                str, "xxh3_64", "per-block checksum: xxh3_64 or crc32", CHECKSUM_ALGORITHMS
            ),
            "tls": _TLS,
            "token": _TOKEN,
            "deadline_s": _DEADLINE,
            "emulate": Param(
                bool, True, "shape traffic with the link model when both ends share a host"
            ),
        },
    ),
    ChannelKind(
        Kind.TOKEN_IDS,
        "token IDs and control messages: gRPC streaming protobuf",
        frozenset({Payload.TOKEN_IDS, Payload.CONTROL}),
        "any",
        {
            "tls": _TLS,
            "token": _TOKEN,
            "deadline_s": _DEADLINE,
            "emulate": Param(
                bool, True, "delay messages by the link model when both ends share a host"
            ),
        },
    ),
):
    CHANNEL_KINDS.register(str(_k.name), _k)
