"""What both ends of an rdma_tensor channel agree on: params, control frames (direct landing or
ring; docs/channels.md, rdma_tensor protocol) and region backends. Tensor bytes are never
serialised."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from pddflow.channels.errors import ChannelError
from pddflow.channels.kv_checksum import DEFAULT_CHECKSUM, check_algorithm
from pddflow.channels.memory_region import RegionBackend
from pddflow.channels.nixl_region import NixlBackend
from pddflow.channels.shm_region import SharedMemoryBackend


class Frame(enum.IntEnum):
    """s->r: HELLO BEGIN CHUNK END CANCEL; r->s: RING PLACE FREE RESULT ERROR."""

    HELLO = 1
    RING = 2
    BEGIN = 3
    CHUNK = 4
    END = 5
    FREE = 6
    RESULT = 7
    CANCEL = 8
    ERROR = 9
    PLACE = 10


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
    # off by default: one host's copy has no wire to corrupt, and checksums cost more than it
    checksum: str | None = None
    transport: str = "auto"  # region backend: auto | shm | nixl
    max_block_retries: int = 3

    def __post_init__(self) -> None:
        if self.checksum is True or self.checksum is False:  # tolerate a YAML boolean
            object.__setattr__(self, "checksum", DEFAULT_CHECKSUM if self.checksum else None)
        if self.checksum is not None:
            check_algorithm(self.checksum)
        if self.ring_slots < 1:
            raise ValueError("rdma_tensor ring_slots must be >= 1")

    @property
    def slot_bytes(self) -> int:
        return max(4096, int(self.slot_mb * (1 << 20)))

    @property
    def arena_bytes(self) -> int:
        return max(0, int(self.arena_mb * (1 << 20))) // 4096 * 4096


def region_backends() -> dict[str, type[RegionBackend]]:
    return {"shm": SharedMemoryBackend, "nixl": NixlBackend}


def pick_backend(name: str = "auto") -> RegionBackend:
    """`auto`: NIXL where it is importable, else shared memory."""
    table = region_backends()
    if name == "auto":
        name = "nixl" if table["nixl"].available() else "shm"
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
