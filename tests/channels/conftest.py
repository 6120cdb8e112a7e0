"""Fixtures for the channel tests: KV sets, TLS material, receiver peers in child processes, and a
guard that makes any use of pickle in the test process fail loudly."""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import time

import numpy as np
import pytest

from pddflow.channels.errors import ChannelTimeout
from pddflow.core.payloads import KVBlocks
from pddflow.testing.peer import PeerProcess, kv_digest

TOKEN = "s3cret-token"


def make_kv(
    seq_id: str = "seq-1",
    num_blocks: int = 12,
    *,
    torch_dtype: str | None = "bfloat16",
    layers: int = 4,
    block_size: int = 16,
    heads: int = 2,
    head_dim: int = 32,
    partial: int = 5,
    seed: int = 0,
    marker: bytes | None = None,
    marker_block: int = 0,
) -> KVBlocks:
    """A KV set with random contents; the last block is partial by `partial` tokens. With marker,
    block `marker_block` is filled with copies of it (FaultyRelay corrupts the first one)."""
    rng = np.random.default_rng(seed)
    shape = (num_blocks, layers, 2, block_size, heads, head_dim)
    nbytes = int(np.prod(shape)) * 2
    raw = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
    if marker is not None:
        per_block = nbytes // num_blocks
        lo = marker_block * per_block
        reps = per_block // len(marker)
        raw[lo : lo + reps * len(marker)] = np.frombuffer(marker * reps, dtype=np.uint8)
    if torch_dtype is not None:
        import torch

        data = torch.from_numpy(raw.copy()).view(getattr(torch, torch_dtype)).reshape(shape)
    else:
        data = raw.view(np.float16).reshape(shape).copy()
    hashes = [int(h) for h in rng.integers(0, 2**63 - 1, size=num_blocks, dtype=np.int64)]
    start = 32
    return KVBlocks(
        seq_id, hashes, start, start + num_blocks * block_size - partial, block_size, data
    )


@pytest.fixture
def kv_factory():
    return make_kv


@pytest.fixture(scope="session")
def tls_dir(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not available to make a test certificate")
    from pddflow.channels.security import self_signed

    d = tmp_path_factory.mktemp("tls")
    return self_signed(d)


@pytest.fixture
def no_pickle(monkeypatch):
    """Any pickling in this process during the test raises."""

    def refuse(*a, **k):
        raise AssertionError("pickle used on a channel path")

    for name in ("dumps", "loads", "dump", "load"):
        monkeypatch.setattr(pickle, name, refuse)
    yield


@pytest.fixture
def peer():
    """Start receiver peers in child processes; all are stopped after the test."""
    started: list[PeerProcess] = []

    def start(role: str, *args: str) -> PeerProcess:
        p = PeerProcess(role, *args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


@pytest.fixture
def same_kv():
    """assert that a peer's digest line describes exactly the KV set we sent (bytes, hashes,
    token range, dtype, shape)."""

    def check(sent: KVBlocks, received_digest: dict) -> None:
        got = {k: v for k, v in received_digest.items() if k != "t"}
        assert got == kv_digest(sent)

    return check


def _wait_stopped(pid: int, within_s: float = 10.0) -> None:
    """SIGSTOP is asynchronous: the peer stops when the kernel next handles its signals, and a
    direct-landing send of 1 MiB completes in a millisecond, so a send begun before the stop takes
    hold can finish. Wait until /proc shows every one of its threads stopped."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        states = [_thread_state(pid, tid) for tid in os.listdir(f"/proc/{pid}/task")]
        if all(s in ("T", "t") for s in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"peer {pid} did not stop within {within_s}s")


def _thread_state(pid: int, tid: str) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:  # the thread ended meanwhile
        return "T"


def _fails_at_deadline_while_stopped(
    send, pid: int, timeout_s: float = 1.5, within_s: float = 6.0
) -> None:
    """Stop the peer process (it stays connected but never answers), then `send(timeout_s)` must
    raise ChannelTimeout at its deadline, not hang; the peer is resumed afterwards."""
    os.kill(pid, signal.SIGSTOP)
    try:
        _wait_stopped(pid)
        t0 = time.monotonic()
        with pytest.raises(ChannelTimeout):
            send(timeout_s)
        assert time.monotonic() - t0 < within_s
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture
def fails_at_deadline_while_stopped():
    return _fails_at_deadline_while_stopped
