"""What both ends of an rdma_tensor channel agree on: params, control frames (direct landing or
ring; docs/channels.md, rdma_tensor protocol) and region backends. Tensor bytes are never
serialised."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pddflow.channels.errors import ChannelError
from pddflow.channels.kv_checksum import DEFAULT_CHECKSUM, check_algorithm
from pddflow.channels.rdma_tensor.memory_region import RegionBackend
from pddflow.channels.rdma_tensor.nixl_region import NixlBackend
from pddflow.channels.rdma_tensor.shm_region import SharedMemoryBackend
from pddflow.channels.rdma_tensor.tcp_region import TcpBackend

VERSION = 2
NO_PLACE = (1 << 64) - 1
CHUNK_FORMAT = struct.Struct("<IQQ")  # slot, byte offset in the set, length
FREE_FORMAT = struct.Struct("<I")  # slot
PLACE_FORMAT = struct.Struct("<Q")  # arena offset or NO_PLACE
# slots, slot bytes, arena bytes, ring fds, arena fds, length of the backend's name
RING_FORMAT = struct.Struct("<IIQBBB")
DIRECT_PIECE = 8 << 20  # direct writes go in pieces, with deadline and cancel checks between


@dataclass(frozen=True)
class SharedMemoryKVParams:
    ring_slots: int = 4
    slot_mb: float = 2.0  # small slots keep the ring in cache between the two copies
    arena_mb: float = 512.0  # per receiver, pages committed on first use; 0: ring only
    deadline_s: float = 10.0
    # auto: off over shared memory (one host's copy has no wire to corrupt, and checksums cost
    # more than it), on over tcp and nixl (a wire can); None or "": off; or an algorithm
    checksum: str | None = "auto"
    # region backend: auto (shm on a unix: address; else nixl where importable, else tcp) | shm
    # | tcp | nixl
    transport: str = "auto"
    max_block_retries: int = 3
    token: str | None = None  # the receiver requires it first on every connection (AUTH)

    def __post_init__(self) -> None:
        if self.checksum is True or self.checksum is False:  # tolerate a YAML boolean
            object.__setattr__(self, "checksum", DEFAULT_CHECKSUM if self.checksum else None)
        if self.checksum == "":
            object.__setattr__(self, "checksum", None)
        if self.checksum not in (None, "auto"):
            check_algorithm(self.checksum)
        if self.ring_slots < 1:
            raise ValueError("rdma_tensor ring_slots must be >= 1")

    def checksum_over(self, backend: RegionBackend) -> str | None:
        """The algorithm a set carries over this backend, or None."""
        if self.checksum == "auto":
            return DEFAULT_CHECKSUM if backend.network else None
        return self.checksum

    @property
    def slot_bytes(self) -> int:
        return max(4096, int(self.slot_mb * (1 << 20)))

    @property
    def arena_bytes(self) -> int:
        return max(0, int(self.arena_mb * (1 << 20))) // 4096 * 4096


def region_backends() -> dict[str, type[RegionBackend]]:
    return {"shm": SharedMemoryBackend, "nixl": NixlBackend, "tcp": TcpBackend}


def pick_backend(name: str = "auto", unix: bool = True) -> RegionBackend:
    """`auto`: shared memory on a unix: address (both ends on one host); on a network address
    NIXL where it is importable, else tcp."""
    table = region_backends()
    if name == "auto":
        name = "shm" if unix else ("nixl" if table["nixl"].available() else "tcp")
    if name not in table:
        raise ChannelError(
            f"unknown rdma_tensor transport {name!r}; valid: auto, {', '.join(sorted(table))}"
        )
    cls = table[name]
    if not cls.available():
        raise ChannelError(
            f"rdma_tensor transport {name!r} is not available here (its library is not importable)"
        )
    return cls()
