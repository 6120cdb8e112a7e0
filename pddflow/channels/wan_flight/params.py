"""The params of a wan_flight channel, shared by its sender and receiver."""

from __future__ import annotations

from dataclasses import dataclass

from pddflow.channels.kv_checksum import DEFAULT_CHECKSUM, check_algorithm
from pddflow.channels.security import TLSConfig
from pddflow.core.link import LinkModel


@dataclass(frozen=True)
class WanFlightParams:
    streams: int = 4
    deadline_s: float = 30.0
    token: str | None = None
    tls: TLSConfig | None = None
    max_batch_bytes: int = 8 << 20  # one record batch (a run of whole blocks)
    max_message_bytes: int = 64 << 20
    keepalive_s: float = 30.0
    emulate: LinkModel | None = None
    seed: int = 0
    checksum: str = DEFAULT_CHECKSUM  # xxh3_64, or crc32
    # receiver: let glibc recycle gRPC's freed receive buffers (core/host_memory.py)
    tune_host_malloc: bool = True

    def __post_init__(self) -> None:
        check_algorithm(self.checksum)
        if self.streams < 1:
            raise ValueError("wan_flight streams must be >= 1")
