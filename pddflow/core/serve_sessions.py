"""The multi-turn workload of `bench serve` and `simulate --serve-workload` (docs/benchmarks.md)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from pddflow.core.mooncake import BLOCK_TOKENS as TRACE_BLOCK_TOKENS
from pddflow.core.mooncake import TraceError, read_records

__all__ = ["TRACE_BLOCK_TOKENS", "SessionSpec", "TraceError", "WorkloadSpec", "build", "read_trace"]


@dataclass(frozen=True)
class SessionSpec:
    first_prompt: list[int]
    user_turns: list[list[int]]  # the new user tokens of turns 2..n
    output_tokens: list[int]  # max_tokens per turn


@dataclass(frozen=True)
class WorkloadSpec:
    sessions: list[SessionSpec]
    scale: float

    @property
    def requests(self) -> int:
        return sum(1 + len(s.user_turns) for s in self.sessions)


def read_trace(path: Path, limit: int) -> list[tuple[int, int, list[int]]]:
    return [(r.input_length, r.output_length, list(r.hash_ids)) for r in read_records(path, limit)]


def build(
    trace: Path,
    sessions: int,
    turns: int,
    scale: float,
    vocab: int,
    seed: int = 0,
    max_output: int = 128,
    user_tokens: int = 24,
    output_scale: float = 0.25,
) -> WorkloadSpec:
    """Outputs shrink less than prompts (`output_scale` vs `scale`) so the relay's eager share of
    output tokens stays what it is at scale, instead of the relay finishing every answer."""
    recs = read_trace(trace, sessions * turns)
    block = max(1, round(TRACE_BLOCK_TOKENS * scale))
    rng = random.Random(seed)

    def block_tokens(h: int) -> list[int]:
        r = random.Random(h * 1_000_003 + 17)
        return [r.randrange(vocab) for _ in range(block)]

    out = []
    for i in range(sessions):
        first = recs[i]
        prompt = [t for h in first[2] for t in block_tokens(h)][
            : max(block, round(first[0] * scale))
        ]
        later = recs[sessions + i * (turns - 1) : sessions + (i + 1) * (turns - 1)]
        outs = [min(max_output, max(4, round(r[1] * output_scale))) for r in [first, *later]]
        users = [[rng.randrange(vocab) for _ in range(user_tokens)] for _ in later]
        out.append(SessionSpec(prompt, users, outs))
    return WorkloadSpec(out, scale)
