"""Mooncake traces as workloads (reading: `core/mooncake.py`); `input_scale` stretches every block,
so the hash structure and every hit rate are kept."""

from __future__ import annotations

from pathlib import Path

from pddflow.core.mooncake import BLOCK_TOKENS as MOONCAKE_BLOCK_TOKENS
from pddflow.core.mooncake import TraceError, read_records
from pddflow.sim.workload import SimRequest, Workload

__all__ = ["MOONCAKE_BLOCK_TOKENS", "TraceError", "load_trace"]


def load_trace(
    path: str | Path,
    *,
    rate_scale: float = 1.0,
    input_scale: float = 1.0,
    output_scale: float = 1.0,
    limit: int | None = None,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> Workload:
    path = Path(path)
    if rate_scale <= 0 or input_scale <= 0 or output_scale <= 0:
        raise TraceError(f"{path}: rate, input and output scales must be > 0")
    bt = max(1, round(block_tokens * input_scale))
    reqs = [
        SimRequest(
            i,
            r.timestamp_ms / 1e3 / rate_scale,
            max(1, round(r.input_length * input_scale)),
            max(1, round(r.output_length * output_scale)),
            r.hash_ids,
        )
        for i, r in enumerate(read_records(path, limit, block_tokens))
    ]
    t0 = reqs[0].arrival_s
    if t0:
        reqs = [
            SimRequest(r.rid, r.arrival_s - t0, r.prompt_tokens, r.output_tokens, r.hashes)
            for r in reqs
        ]
    return Workload(
        path.name,
        reqs,
        bt,
        {
            "source": str(path),
            "rate_scale": rate_scale,
            "input_scale": input_scale,
            "output_scale": output_scale,
        },
    )
