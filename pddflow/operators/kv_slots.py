"""The slots of one KV tier below the device: which block hash sits in which slot, least recently
used first, and the free slots. The tiers (kv_tiers.HostArena, kv_disk.DiskTier) own the bytes."""

from __future__ import annotations

from collections import OrderedDict


class TierSlots:
    def __init__(self, capacity_blocks: int, what: str):
        if capacity_blocks <= 0:
            raise ValueError(f"a {what} tier needs room for one block at least, got none")
        self.capacity = capacity_blocks
        self.slots: OrderedDict[int, int] = OrderedDict()  # hash -> slot, least recent first
        self._free = list(range(capacity_blocks - 1, -1, -1))  # popped from the end: 0 first

    def __len__(self) -> int:
        return len(self.slots)

    def __contains__(self, h: int) -> bool:
        return h in self.slots

    def claim(self, h: int) -> tuple[int | None, int | None]:
        """(the slot to write `h` into, None when it is held already (now most recent); the hash
        dropped for room, if any)."""
        if h in self.slots:
            self.slots.move_to_end(h)
            return None, None
        dropped = None
        if self._free:
            slot = self._free.pop()
        else:
            dropped, slot = self.slots.popitem(last=False)
        self.slots[h] = slot
        return slot, dropped

    def release(self, h: int) -> int:
        """Forget `h`; returns its slot, free again."""
        slot = self.slots.pop(h)
        self._free.append(slot)
        return slot
