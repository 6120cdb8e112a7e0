"""KV block checksums over one 16 MiB buffer: the default (xxh3_64) and crc32 beside xsum64, the
default until 2026-12-03 (kept here as the baseline). Median of --reps runs of each, hashed whole
and as blocks of --block-kib; the runners alternate rep by rep so a neighbour's load hits all.

    python benchmarks/checksum.py [--size-mb 16] [--block-kib 64] [--reps 15] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import numpy as np

from pddflow.channels.kv_checksum import CHECKSUMS
from pddflow.channels.kv_layout import U64_MASK


@functools.lru_cache(maxsize=8)
def _weights(n: int) -> np.ndarray:
    return np.arange(1, 2 * n, 2, dtype=np.uint64)  # cached, as the old code cached them


def xsum64(meta: tuple[int, int, int, int], kv: np.ndarray) -> int:
    """The old default: sum of (2k + 1) x word_k mod 2^64 over the metadata, then the K/V words."""
    b = kv.reshape(-1)
    n = b.shape[0] // 8
    w = _weights(4 + n + 1)
    total = int(np.dot(b[: n * 8].view(np.uint64), w[4 : 4 + n]))
    total += sum((m & U64_MASK) * int(w[k]) for k, m in enumerate(meta))
    if b.shape[0] % 8:
        total += int.from_bytes(b[n * 8 :].tobytes().ljust(8, b"\0"), "little") * int(w[-1])
    return total & U64_MASK


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=16)
    ap.add_argument("--block-kib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    buf = np.random.default_rng(0).integers(0, 256, a.size_mb << 20, dtype=np.uint8)
    algs = {"xsum64 (old)": xsum64, **CHECKSUMS}
    shapes = {
        "whole": buf.reshape(1, -1),
        f"{a.block_kib} KiB blocks": buf.reshape(-1, a.block_kib << 10),
    }
    times: dict[tuple[str, str], list[float]] = {(s, n): [] for s in shapes for n in algs}
    for _ in range(a.reps + 1):  # the first rep warms up and is dropped
        for s, rows in shapes.items():
            for n, fn in algs.items():
                t = time.perf_counter()
                for i in range(rows.shape[0]):
                    fn((i, 1, 0, 16), rows[i])
                times[s, n].append(time.perf_counter() - t)
    out = [
        {
            "shape": s,
            "checksum": n,
            "median_ms": round(statistics.median(ts[1:]) * 1e3, 3),
            "gib_per_s": round(a.size_mb / 1024 / statistics.median(ts[1:]), 2),
        }
        for (s, n), ts in times.items()
    ]
    if a.json:
        print(json.dumps({"size_mb": a.size_mb, "reps": a.reps, "results": out}, indent=2))
        return
    for r in out:
        ms, rate = r["median_ms"], r["gib_per_s"]
        print(f"{r['shape']:>15} {r['checksum']:>13}: {ms:8.3f} ms  {rate:6.2f} GiB/s")


if __name__ == "__main__":
    main()
