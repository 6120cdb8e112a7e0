"""Mooncake-format JSONL traces (FAST'25), for the simulator and `bench serve`: one request per
line, {"timestamp": ms, "input_length", "output_length", "hash_ids": [one per block]}."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BLOCK_TOKENS = 512  # tokens per hash id in the published traces


class TraceError(ValueError):
    pass


@dataclass(frozen=True)
class TraceRecord:
    line: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def read_records(
    path: str | Path, limit: int | None = None, block_tokens: int = BLOCK_TOKENS
) -> Iterator[TraceRecord]:
    """The first `limit` requests, checked: a TraceError says `FILE:LINE: what is wrong`."""
    path = Path(path)
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    n = 0
    last_ts = -math.inf
    with fh:
        for lineno, raw in enumerate(fh, 1):
            if limit is not None and n >= limit:
                break
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(raw)
            except UnicodeDecodeError:
                raise TraceError(f"{where}: not UTF-8 text") from None
            except json.JSONDecodeError as exc:
                raise TraceError(
                    f"{where}: not valid JSON ({exc.msg} at column {exc.colno})"
                ) from None
            rec = _record(obj, where, lineno, block_tokens)
            if rec.timestamp_ms < last_ts:
                raise TraceError(
                    f"{where}: timestamp {rec.timestamp_ms} is earlier than the previous line's "
                    f"{last_ts:g}; a trace must be sorted by arrival"
                )
            last_ts = rec.timestamp_ms
            n += 1
            yield rec
    if n == 0:
        raise TraceError(f"{path}: no requests")


def _record(obj: object, where: str, lineno: int, block_tokens: int) -> TraceRecord:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [
        k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in obj
    ]
    if missing:
        raise TraceError(
            f"{where}: missing key(s) {', '.join(missing)} (Mooncake format: timestamp, "
            "input_length, output_length, hash_ids)"
        )
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0 or not math.isfinite(ts):
        raise TraceError(
            f"{where}: timestamp must be a non-negative number of milliseconds, got {ts!r}"
        )
    for k in ("input_length", "output_length"):
        v = obj[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TraceError(f"{where}: {k} must be a positive integer, got {v!r}")
    hashes = obj["hash_ids"]
    if (
        not isinstance(hashes, list)
        or not hashes
        or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes)
    ):
        raise TraceError(f"{where}: hash_ids must be a non-empty list of integers")
    need = -(-obj["input_length"] // block_tokens)
    if len(hashes) != need:
        raise TraceError(
            f"{where}: {len(hashes)} hash_ids for input_length {obj['input_length']}; expected "
            f"ceil({obj['input_length']}/{block_tokens}) = {need}"
        )
    return TraceRecord(lineno, float(ts), obj["input_length"], obj["output_length"], tuple(hashes))
