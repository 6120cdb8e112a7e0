"""`pddflow bench channels`: every channel next to its baseline (raw TCP, memcpy) on 127.0.0.1,
into warm destinations (docs/channels.md, Measured). Gbps are decimal (1e9 bits/s)."""

from __future__ import annotations

import os
import random
import socket
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np

from pddflow.channels.kv_checksum import DEFAULT_CHECKSUM

# a Llama-3-8B-like block: 32 layers, K/V, 16 tokens, 8 KV heads, head dim 128
BLOCK_SHAPE = (32, 2, 16, 8, 128)
BLOCK_BYTES = int(np.prod(BLOCK_SHAPE)) * 2  # fp16: 2 MiB


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes * 8 / seconds / 1e9


WARMUP = 3


def _pair(nbytes: int, runs: dict[str, Callable[[], float]], reps: int) -> dict[str, dict]:
    """Runners alternate rep by rep, so a neighbour's load hits both sides alike. WARMUP runs
    each first: the wan_flight receiver's heap takes a few sets to reach its steady size."""
    for _ in range(WARMUP):
        for run in runs.values():
            run()
    secs: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(reps):
        for k, run in runs.items():
            secs[k].append(run())
    out = {}
    for k, ss in secs.items():
        rates = [_gbps(nbytes, x) for x in ss]
        out[k] = {
            "gbps": round(statistics.median(rates), 3),
            "samples_gbps": [round(r, 3) for r in rates],
        }
    return out


def make_kv(size_mb: int) -> Any:
    from pddflow.core.payloads import KVBlocks

    n = max(1, (size_mb << 20) // BLOCK_BYTES)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 1 << 16, size=(n, *BLOCK_SHAPE), dtype=np.uint16).view(np.float16)
    return KVBlocks(
        "bench-seq", [int(h) for h in rng.integers(0, 2**62, size=n)], 0, n * 16, 16, data
    )


def raw_tcp_runner(stack: ExitStack, kv: Any) -> Callable[[], float]:
    from pddflow.testing.peer import PeerProcess

    src = memoryview(kv.data.reshape(-1).view(np.uint8))
    rx = stack.enter_context(PeerProcess("tcp-recv", "--nbytes", str(kv.data.nbytes)))
    host, port = rx.address.split(":")
    s = stack.enter_context(socket.create_connection((host, int(port)), timeout=120))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def run() -> float:
        t0 = time.perf_counter()
        s.sendall(src)
        if s.recv(1) != b"k":
            raise RuntimeError("raw TCP receiver did not confirm")
        return time.perf_counter() - t0

    return run


def wan_flight_runner(
    stack: ExitStack, kv: Any, streams: int, emulate: Any = None
) -> Callable[[], float]:
    from pddflow.channels.wan_flight.params import WanFlightParams
    from pddflow.channels.wan_flight.sender import WanFlightSender
    from pddflow.testing.peer import PeerProcess

    params = WanFlightParams(streams=streams, emulate=emulate, deadline_s=600)
    rx = stack.enter_context(PeerProcess("wan-recv", "--reuse-dest", "--no-digest"))
    tx = stack.enter_context(WanFlightSender(rx.address, params=params))
    tx.connect(timeout_s=30)

    def run() -> float:
        report = tx.send(kv, timeout_s=600)  # a fresh send: checksums are computed every time
        done = rx.line(120)["kv"]
        if done["num_blocks"] != kv.num_blocks:
            raise RuntimeError(f"receiver got {done['num_blocks']} blocks, sent {kv.num_blocks}")
        return report.seconds

    return run


def rdma_tensor_runner(
    stack: ExitStack, kv: Any, ring_slots: int, slot_mb: float, direct: bool, transport: str = "shm"
) -> Callable[[], float]:
    """direct: the receiver's landing arena (the default); else the ring into a warm destination.
    transport tcp: the network path over 127.0.0.1 (checksums on, its default)."""
    from pddflow.channels.rdma_tensor.protocol import SharedMemoryKVParams
    from pddflow.channels.rdma_tensor.sender import SharedMemoryKVSender
    from pddflow.testing.peer import PeerProcess

    arena_mb = max(512.0, 2 * kv.data.nbytes / (1 << 20)) if direct else 0.0
    params = SharedMemoryKVParams(
        ring_slots=ring_slots, slot_mb=slot_mb, arena_mb=arena_mb, deadline_s=600
    )
    net = ["--transport", "tcp", "--address", "tcp:127.0.0.1:0"] if transport == "tcp" else []
    args = [
        "--no-digest",
        "--ring-slots",
        str(ring_slots),
        "--slot-mb",
        str(slot_mb),
        "--arena-mb",
        str(arena_mb),
    ]
    rx = stack.enter_context(
        PeerProcess("rdma-recv", *args, *net, *([] if direct else ["--reuse-dest"]))
    )
    tx = stack.enter_context(SharedMemoryKVSender(rx.address, params=params))

    def run() -> float:
        report = tx.send(kv, timeout_s=600)
        rx.line(120)
        if tx.last_mode != ("direct" if direct else "ring"):
            want = "direct" if direct else "ring"
            raise RuntimeError(f"rdma_tensor travelled by {tx.last_mode}, expected {want}")
        return report.seconds

    return run


def memcpy_runner(kv: Any) -> Callable[[], float]:
    src = kv.data
    dst = np.empty_like(src)

    def run() -> float:
        t0 = time.perf_counter()
        np.copyto(dst, src)
        return time.perf_counter() - t0

    return run


def bench_token_ids(samples: int) -> dict:
    from pddflow.channels.link_relay import LinkRelay
    from pddflow.channels.token_ids.client import TokenIdsClient
    from pddflow.channels.token_ids.codec import envelope
    from pddflow.core.payloads import TokenIds
    from pddflow.testing.peer import PeerProcess

    rng = random.Random(0)

    def handoff(i: int) -> TokenIds:  # 100 generated IDs from a 128K vocabulary, deep in a prompt
        return TokenIds(
            f"req-{i:016x}", 65536 + 100 * i, [rng.randrange(128_000) for _ in range(100)]
        )

    out: dict[str, Any] = {}
    with PeerProcess("tok-server", "--quiet") as srv:
        with TokenIdsClient(srv.address, name="bench-relay") as cli:  # round trips, direct
            cli.connect(timeout_s=30)
            for i in range(100):
                cli.send(handoff(i), timeout_s=10)
            rtts = []
            for i in range(samples):
                t = handoff(i)
                t0 = time.perf_counter()
                cli.send(t, timeout_s=10)
                rtts.append(time.perf_counter() - t0)
        rtts.sort()
        out["rtt_p50_ms"] = round(rtts[len(rtts) // 2] * 1e3, 4)
        out["rtt_p99_ms"] = round(rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))] * 1e3, 4)
        out["rtt_samples"] = len(rtts)
        host, port = srv.address.split(":")
        with LinkRelay((host, int(port))) as relay:  # wire size, through a byte-counting relay
            with TokenIdsClient(relay.address, name="bench-relay-2") as cli:
                cli.connect(timeout_s=30)
                for i in range(50):
                    cli.send(handoff(i), timeout_s=10)
                time.sleep(0.05)
                relay.reset_counters()
                n = 500
                for i in range(n):
                    cli.send(handoff(i), timeout_s=10)
                time.sleep(0.05)
                up, down = relay.stats.up_bytes, relay.stats.down_bytes
        out["bytes_per_100_tokens"] = round(up / n, 1)
        out["ack_bytes_per_handoff"] = round(down / n, 1)
        out["protobuf_bytes"] = envelope(handoff(0), 1).ByteSize()
    return out


def run_all(
    size_mb: int = 256,
    reps: int = 5,
    streams: int = 4,
    shaped_gbps: float = 1.0,
    shaped_rtt_ms: float = 20.0,
    ring_slots: int = 4,
    slot_mb: float = 2.0,
    rtt_samples: int = 1000,
    progress: Callable[[str], None] = lambda s: None,
) -> dict:
    from pddflow.core.link import Jitter, LinkModel

    kv = make_kv(size_mb)
    nbytes = kv.data.nbytes
    res: dict[str, Any] = {
        "size_mb": round(nbytes / (1 << 20), 1),
        "reps": reps,
        "host_cpus": os.cpu_count(),
    }
    progress(
        f"wan_flight ({streams} streams) vs raw TCP, {res['size_mb']} MiB, "
        f"{reps} alternating runs each"
    )
    with ExitStack() as stack:
        pair = _pair(
            nbytes,
            {
                "raw_tcp": raw_tcp_runner(stack, kv),
                "wan_flight": wan_flight_runner(stack, kv, streams),
            },
            reps,
        )
    res["raw_tcp"] = pair["raw_tcp"]
    res["wan_flight"] = {**pair["wan_flight"], "streams": streams, "checksum": DEFAULT_CHECKSUM}
    progress(
        f"rdma_tensor (direct landing, and a {ring_slots} x {slot_mb} MiB ring) "
        "vs in-process memcpy"
    )
    with ExitStack() as stack:
        pair = _pair(
            nbytes,
            {
                "memcpy": memcpy_runner(kv),
                "rdma_tensor": rdma_tensor_runner(stack, kv, ring_slots, slot_mb, direct=True),
                "rdma_tensor_ring": rdma_tensor_runner(
                    stack, kv, ring_slots, slot_mb, direct=False
                ),
                "rdma_tensor_tcp": rdma_tensor_runner(
                    stack, kv, ring_slots, slot_mb, direct=True, transport="tcp"
                ),
            },
            reps,
        )
    res["memcpy"] = pair["memcpy"]
    res["rdma_tensor"] = {
        **pair["rdma_tensor"],
        "mode": "direct (landing arena)",
        "transport": "shm",
        "checksum": None,
    }
    res["rdma_tensor_tcp"] = {
        **pair["rdma_tensor_tcp"],
        "mode": "direct (landing arena)",
        "transport": "tcp (127.0.0.1)",
        "checksum": DEFAULT_CHECKSUM,
    }
    res["rdma_tensor_ring"] = {
        **pair["rdma_tensor_ring"],
        "mode": "ring",
        "ring_slots": ring_slots,
        "slot_mb": slot_mb,
        "transport": "shm",
        "checksum": None,
    }
    progress(f"token_ids: {rtt_samples} round trips and the wire size of a handoff")
    res["token_ids"] = bench_token_ids(rtt_samples)
    link = LinkModel(
        "bench",
        "A",
        "B",
        gbps=shaped_gbps,
        rtt_ms=shaped_rtt_ms,
        jitter=Jitter(p50_ms=shaped_rtt_ms / 20, p99_ms=shaped_rtt_ms / 4),
    )
    progress(f"wan_flight shaped at {shaped_gbps} Gbps, rtt {shaped_rtt_ms} ms")
    with ExitStack() as stack:
        run = wan_flight_runner(stack, kv, streams, emulate=link)
        seconds = run()
    shaped = _gbps(nbytes, seconds)
    res["shaped"] = {
        "target_gbps": shaped_gbps,
        "gbps": round(shaped, 4),
        "seconds": round(seconds, 3),
        "rtt_ms": shaped_rtt_ms,
        "jitter_p50_ms": link.jitter.p50_ms,
        "jitter_p99_ms": link.jitter.p99_ms,
        "error_pct": round(100 * (shaped - shaped_gbps) / shaped_gbps, 2),
    }
    w, t = res["wan_flight"]["gbps"], res["raw_tcp"]["gbps"]
    r, m = res["rdma_tensor"]["gbps"], res["memcpy"]["gbps"]
    res["ratios"] = {
        "wan_flight_vs_raw_tcp": round(w / t, 3),
        "rdma_tensor_vs_memcpy": round(r / m, 3),
        "rdma_tensor_ring_vs_memcpy": round(res["rdma_tensor_ring"]["gbps"] / m, 3),
    }
    tok = res["token_ids"]
    res["targets"] = {
        "wan_flight >= 0.5x raw_tcp": w >= 0.5 * t,
        "rdma_tensor >= 0.5x memcpy": r >= 0.5 * m,
        "100-token handoff <= 1.5 KB": tok["bytes_per_100_tokens"] <= 1536,
        "token_ids rtt p50 < 1 ms": tok["rtt_p50_ms"] < 1.0,
        "shaped within 10%": abs(res["shaped"]["error_pct"]) <= 10.0,
    }
    return res
