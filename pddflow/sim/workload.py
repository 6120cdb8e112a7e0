"""What the simulator replays: requests with arrival times, lengths and prompt block hashes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SimRequest:
    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    hashes: tuple[int, ...]
    parent: int = -1  # closed-loop sessions: arrive `gap_s` after request `parent` finishes
    gap_s: float = 0.0
    # prompt + output full-block hashes, when known: main caches them for the next turn
    done_hashes: tuple[int, ...] = ()
    session: int = -1  # multi-turn workloads: which session and turn (reports only)
    turn: int = -1


@dataclass
class Workload:
    name: str
    requests: list[SimRequest]
    block_tokens: int  # tokens one hash covers
    meta: dict = field(default_factory=dict)
    # contexts cached at t=0 (sessions under way), placed through the scheduler at no time cost
    warm_prefixes: list[tuple[int, ...]] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        if not self.requests:
            return 0.0
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    def unbounded_hit_rates(self) -> list[float]:
        """Per-request prefix hit (share of blocks) with an unbounded cache."""
        seen: set[int] = {h for p in self.warm_prefixes for h in p}
        out = []
        for r in self.requests:
            k = 0
            for h in r.hashes:
                if h not in seen:
                    break
                k += 1
            out.append(k / len(r.hashes) if r.hashes else 0.0)
            seen.update(r.hashes)
        return out
