"""Mooncake-format JSONL traces (FAST'25 release): one request per line,

    {"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [one per block]}

Every problem is reported as `FILE:LINE: message`, never a traceback. Scaling: `rate_scale`
compresses arrival times (2.0 = twice the request rate), `input_scale` stretches every prompt block
(the hash structure, hence every hit rate, is kept), `output_scale` stretches outputs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pddflow.sim.workload import SimRequest, Workload

MOONCAKE_BLOCK_TOKENS = 512


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the file and line."""


def load_trace(path: str | Path, *, rate_scale: float = 1.0, input_scale: float = 1.0, output_scale: float = 1.0,
               limit: int | None = None, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Workload:
    path = Path(path)
    if rate_scale <= 0 or input_scale <= 0 or output_scale <= 0:
        raise TraceError(f"{path}: rate, input and output scales must be > 0")
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    reqs: list[SimRequest] = []
    bt = max(1, round(block_tokens * input_scale))
    last_ts = -math.inf
    with fh:
        for lineno, raw in enumerate(fh, 1):
            if limit is not None and len(reqs) >= limit:
                break
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(raw)
            except UnicodeDecodeError:
                raise TraceError(f"{where}: not UTF-8 text") from None
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            ts, inp, out, hashes = _fields(obj, where, block_tokens)
            if ts < last_ts:
                raise TraceError(f"{where}: timestamp {ts} is earlier than the previous line's {last_ts:g}; "
                                 "a trace must be sorted by arrival")
            last_ts = ts
            reqs.append(SimRequest(len(reqs), ts / 1e3 / rate_scale, max(1, round(inp * input_scale)),
                                   max(1, round(out * output_scale)), hashes))
    if not reqs:
        raise TraceError(f"{path}: no requests")
    t0 = reqs[0].arrival_s
    if t0:
        reqs = [SimRequest(r.rid, r.arrival_s - t0, r.prompt_tokens, r.output_tokens, r.hashes) for r in reqs]
    return Workload(path.name, reqs, bt, {"source": str(path), "rate_scale": rate_scale,
                                           "input_scale": input_scale, "output_scale": output_scale})


def _fields(obj: object, where: str, block_tokens: int) -> tuple[float, int, int, tuple[int, ...]]:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in obj]
    if missing:
        raise TraceError(f"{where}: missing key(s) {', '.join(missing)} (Mooncake format: timestamp, "
                         "input_length, output_length, hash_ids)")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0 or not math.isfinite(ts):
        raise TraceError(f"{where}: timestamp must be a non-negative number of milliseconds, got {ts!r}")
    for k in ("input_length", "output_length"):
        v = obj[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TraceError(f"{where}: {k} must be a positive integer, got {v!r}")
    hashes = obj["hash_ids"]
    if not isinstance(hashes, list) or not hashes or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
        raise TraceError(f"{where}: hash_ids must be a non-empty list of integers")
    need = -(-obj["input_length"] // block_tokens)
    if len(hashes) != need:
        raise TraceError(f"{where}: {len(hashes)} hash_ids for input_length {obj['input_length']}; expected "
                         f"ceil({obj['input_length']}/{block_tokens}) = {need}")
    return float(ts), obj["input_length"], obj["output_length"], tuple(hashes)
