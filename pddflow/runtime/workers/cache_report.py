"""What a worker tells the router about its cache: deltas for the mirror (every tier's blocks,
each with the fastest tier holding it) and each tier's counters for /metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pddflow.core.cache_tiers import TIER_NAMES
from pddflow.operators.cache_state import TierLoad
from pddflow.runtime.proto import runtime_pb2 as pb

if TYPE_CHECKING:
    from pddflow.operators.engine import Engine


def delta(
    inserted: list[tuple[int, int]],
    evicted: list[int],
    moved: list[tuple[int, int]],
    full: bool = False,
) -> pb.CacheDelta:
    """One CacheDelta; the tiers travel only when some block is below the device."""
    tiers = [t for _, t in inserted]
    return pb.CacheDelta(
        inserted=[h for h, _ in inserted],
        inserted_tier=tiers if any(tiers) else [],
        evicted=evicted,
        full=full,
        moved=[h for h, _ in moved],
        moved_tier=[t for _, t in moved],
    )


def tier_stats(engine: Engine) -> list[pb.TierStats]:
    """Each tier of the engine's cache (none without tiers under it)."""
    tiers = engine.tiers
    if tiers is None:
        return []
    sizes = {
        "device": (len(engine.radix), engine.allocator.num_blocks),
        "host": (len(tiers.host), tiers.host.capacity) if tiers.host else None,
        "disk": (len(tiers.disk), tiers.disk.capacity) if tiers.disk else None,
    }
    out = []
    for name in TIER_NAMES:
        if sizes[name] is None:
            continue
        s = tiers.stats[name]
        out.append(
            pb.TierStats(
                tier=name,
                blocks=sizes[name][0],
                capacity_blocks=sizes[name][1],
                hit_blocks=s.hit_blocks,
                loaded_bytes=s.loaded_bytes,
                load_s=s.load_s,
                stored_blocks=s.stored_blocks,
                evicted_blocks=s.evicted_blocks,
                corrupt_blocks=tiers.disk.corrupt_dropped if name == "disk" else 0,
            )
        )
    return out


def load_event(load: TierLoad) -> dict[str, float]:
    """A timeline event's values for one load from below the device: blocks per tier, seconds."""
    values = {f"{tier}_blocks": float(n) for tier, n in load.blocks.items()}
    values["seconds"] = load.seconds
    return values
