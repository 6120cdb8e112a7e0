"""What both ends of an rdma_tensor channel agree on: its params, the control frames and the
region backends.

Tensor bytes are never serialised. The receiver owns memory the sender writes into, one of two
ways per KV set:

  direct  The receiver keeps a landing arena (`arena_mb`, shared by every sender) and reserves a
          region there per set; the sender copies the blocks straight into it, as an RDMA write
          lands in registered memory, and the receiver hands that region out as the KVBlocks'
          tensor: one copy end to end. The region returns to the arena when the worker drops the
          tensor and every view of it.
  ring    When the arena is off or full, or the worker supplies its own destination (`alloc`),
          the sender copies runs of blocks into a ring of `ring_slots` x `slot_mb` slots and the
          receiver copies each slot into the destination and hands the slot back. The two copies
          overlap in the two processes.

Control frames (`control_socket.py`; `struct` or protobuf payloads, no pickle):

    HELLO  s->r  protocol version           RING   r->s  backend, ring and arena (+ memfds)
    BEGIN  s->r  KVTransfer (layout, hashes, token range, optional per-block checksums)
    PLACE  r->s  arena offset, or NO_PLACE: use the ring
    CHUNK  s->r  slot, byte offset, length  FREE   r->s  slot          (ring mode only)
    END    s->r  pass done                  RESULT r->s  KVAck: rejected blocks, complete
    CANCEL s->r  KVCancel                   ERROR  r->s  text (e.g. the sequence was cancelled)

With `checksum="xsum64"` (or "crc32") the receiver verifies every block after a pass and the
sender resends the rejected ones, at most `max_block_retries` times. Off by default: a copy
between two processes on one host has no wire to corrupt it, and a checksum pass on each side
costs more than the copy.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from pddflow.channels.errors import ChannelError
from pddflow.channels.kv_checksum import check_algorithm
from pddflow.channels.memory_region import RegionBackend
from pddflow.channels.nixl_region import NixlBackend
from pddflow.channels.shm_region import SharedMemoryBackend


class Frame(enum.IntEnum):
    """Control frame kinds (the table above)."""

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
    """Channel params a graph edge passes (`channel: rdma_tensor`)."""

    ring_slots: int = 4
    slot_mb: float = 2.0  # small slots keep the ring in cache between the two copies
    arena_mb: float = 512.0  # per receiver, pages committed on first use; 0: ring only
    deadline_s: float = 10.0
    checksum: str | None = None  # None, "xsum64" or "crc32": the receiver verifies and NACKs
    transport: str = "auto"  # region backend: auto | shm | nixl
    max_block_retries: int = 3

    def __post_init__(self) -> None:
        if self.checksum is True or self.checksum is False:  # tolerate a YAML boolean
            object.__setattr__(self, "checksum", "xsum64" if self.checksum else None)
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
