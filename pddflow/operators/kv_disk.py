"""The disk tier under a KV cache: one arena file of fixed-size slots, each a checksummed header and
one block's bytes (docs/engine.md, Tiered cache). The header names the block's hash, so the arena
is its own index: a restarted worker re-opens it by reading every slot, keeping those whose
checksum holds and dropping the rest (a torn write, a flipped bit)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import xxhash

from pddflow.operators.kv_slots import TierSlots

MAGIC = b"PDDKVBLK"
_HEADER = struct.Struct("<8sQQQ")  # magic, block hash, xxh3_64 of hash + payload, payload bytes
ALIGN = 4096  # slots start on page boundaries: a block's read is whole pages
ARENA, META = "arena.kv", "meta.json"


def _sum(h: int, payload) -> int:
    x = xxhash.xxh3_64(h.to_bytes(8, "little"))
    x.update(payload)
    return x.intdigest()


class DiskTier(TierSlots):
    """`identity`: what makes a stored block valid for this engine (model, block shape, dtype);
    an arena written under another identity is discarded on open, never read."""

    def __init__(self, directory: Path, capacity_blocks: int, block_bytes: int, identity: dict):
        super().__init__(capacity_blocks, "disk")
        self.dir = Path(directory)
        self.block_bytes = block_bytes
        self.slot_bytes = -(-(_HEADER.size + block_bytes) // ALIGN) * ALIGN
        self.corrupt_dropped = 0  # blocks whose checksum failed (on open or on a read)
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = {"identity": identity, "block_bytes": block_bytes, "slot_bytes": self.slot_bytes}
        meta_path, arena = self.dir / META, self.dir / ARENA
        try:
            same = json.loads(meta_path.read_text()) == meta
        except (OSError, ValueError):
            same = False
        if not same:  # another model or layout wrote it (or nothing did): start empty
            arena.unlink(missing_ok=True)
            meta_path.write_text(json.dumps(meta, sort_keys=True))
        self._fd = os.open(arena, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self._fd, capacity_blocks * self.slot_bytes)
        self.reopened = self._scan() if same else 0

    def _slot(self, slot: int) -> tuple[int | None, memoryview | None]:
        """(the hash its header names, None without a header; the block's bytes, None when the
        length or the checksum does not hold)."""
        raw = os.pread(self._fd, self.slot_bytes, slot * self.slot_bytes)
        magic, h, checksum, n = _HEADER.unpack_from(raw)
        if magic != MAGIC:
            return None, None
        payload = memoryview(raw)[_HEADER.size : _HEADER.size + self.block_bytes]
        ok = n == self.block_bytes and _sum(h, payload) == checksum
        return h, payload if ok else None

    def _scan(self) -> int:
        """Index the blocks a previous worker left; returns how many were kept."""
        taken: set[int] = set()
        for slot in range(self.capacity):
            h, payload = self._slot(slot)
            if h is None:
                continue
            if payload is None or h in self.slots:
                self._erase(slot)
                self.corrupt_dropped += 1
                continue
            self.slots[h] = slot
            taken.add(slot)
        self._free = [s for s in range(self.capacity - 1, -1, -1) if s not in taken]
        return len(self.slots)

    def put(self, h: int, payload) -> int | None:
        """Store one block (any buffer of block_bytes); returns the hash dropped for room."""
        slot, dropped = self.claim(h)
        if slot is not None:
            header = _HEADER.pack(MAGIC, h, _sum(h, payload), self.block_bytes)
            os.pwritev(self._fd, [header, payload], slot * self.slot_bytes)
        return dropped

    def read(self, h: int) -> bytearray | None:
        """The block's bytes, or None when its checksum fails (the block is dropped)."""
        named, payload = self._slot(self.slots[h])
        if named != h or payload is None:
            self.drop(h)
            self.corrupt_dropped += 1
            return None
        self.slots.move_to_end(h)
        return bytearray(payload)

    def drop(self, h: int) -> None:
        self._erase(self.release(h))

    def _erase(self, slot: int) -> None:
        os.pwrite(self._fd, bytes(_HEADER.size), slot * self.slot_bytes)

    def close(self, remove: bool) -> None:
        """`remove`: delete the arena (a tier that does not persist leaves no file)."""
        if self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)
