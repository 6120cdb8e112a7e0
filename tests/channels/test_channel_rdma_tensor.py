"""rdma_tensor between two processes through shared memory (direct landing arena and ring):
bit-exact, corrupt blocks resent (checksums on), deadlines on a silent or stopped receiver, a dead
receiver reported, arena memory returned when the worker drops the tensor."""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid

import numpy as np
import pytest

from pddflow.channels.errors import (
    ChannelCancelled,
    ChannelClosed,
    ChannelCorrupt,
    ChannelError,
    ChannelTimeout,
)
from pddflow.channels.nixl_region import NixlBackend
from pddflow.channels.shm_kv import (
    SharedMemoryKVParams,
    SharedMemoryKVReceiver,
    SharedMemoryKVSender,
)
from pddflow.testing.faults import FaultyKVSender
from pddflow.testing.peer import PeerProcess


@pytest.fixture(scope="module")
def direct_rx():
    p = PeerProcess("rdma-recv", "--arena-mb", "16")
    yield p
    p.stop()


@pytest.fixture(scope="module")
def ring_rx():
    p = PeerProcess("rdma-recv", "--ring-slots", "4", "--slot-mb", "0.05", "--arena-mb", "0")
    yield p
    p.stop()


@pytest.fixture(params=["direct", "ring"])
def rx_proc(request, direct_rx, ring_rx):
    return {"direct": direct_rx, "ring": ring_rx}[request.param], request.param


@pytest.mark.slow
@pytest.mark.parametrize("torch_dtype", ["bfloat16", None])
def test_round_trip_between_processes_is_bit_exact(
    rx_proc, kv_factory, same_kv, no_pickle, torch_dtype
):
    rx, mode = rx_proc
    kv = kv_factory(f"rdma-{torch_dtype}", num_blocks=30, torch_dtype=torch_dtype)
    with SharedMemoryKVSender(rx.address) as tx:
        report = tx.send(kv, timeout_s=20)
        assert report.bytes == 30 * (16 << 10) and tx.last_mode == mode  # 30 blocks of 16 KiB
        same_kv(kv, rx.line(10)["kv"])
        kv2 = kv_factory("rdma-again", num_blocks=5, torch_dtype=torch_dtype, seed=3)
        tx.send(kv2, timeout_s=20)  # the ring / arena region is reused for the next set
        same_kv(kv2, rx.line(10)["kv"])


@pytest.mark.slow
def test_ring_slots_smaller_than_a_block(kv_factory, same_kv):
    kv = kv_factory("rdma-split", num_blocks=9, torch_dtype=None)  # 16 KiB blocks, 10 KiB slots
    with PeerProcess(
        "rdma-recv", "--ring-slots", "3", "--slot-mb", "0.01", "--arena-mb", "0"
    ) as rx:
        with SharedMemoryKVSender(rx.address) as tx:
            tx.send(kv, timeout_s=20)
        same_kv(kv, rx.line(10)["kv"])


@pytest.mark.slow
def test_corrupt_block_is_detected_and_resent(rx_proc, kv_factory, same_kv):
    rx_proc, _ = rx_proc
    kv = kv_factory("rdma-corrupt", num_blocks=12, torch_dtype=None)
    hit = []

    def fault(offset: int, piece: np.ndarray):
        if offset == 0 and not hit:  # corrupt the first write once, in transit
            hit.append(1)
            bad = piece.copy()
            bad[1000] ^= 0x40
            return bad
        return None

    with FaultyKVSender(
        rx_proc.address, params=SharedMemoryKVParams(checksum="xxh3_64"), fault=fault
    ) as tx:
        report = tx.send(kv, timeout_s=20)
    assert hit and report.resent_blocks == 1
    same_kv(kv, rx_proc.line(10)["kv"])


@pytest.mark.slow
def test_block_that_stays_corrupt_fails_after_retries(direct_rx, kv_factory):
    rx_proc = direct_rx
    kv = kv_factory("rdma-hopeless", num_blocks=3, torch_dtype=None)

    def always(offset: int, piece: np.ndarray):
        bad = piece.copy()
        bad[0] ^= 1
        return bad

    params = SharedMemoryKVParams(checksum="crc32", max_block_retries=2)
    with FaultyKVSender(rx_proc.address, params=params, fault=always) as tx:
        with pytest.raises(ChannelCorrupt) as err:
            tx.send(kv, timeout_s=20)
    assert err.value.bad_blocks == [0]  # the fault flips a byte of block 0 on every pass


@pytest.mark.slow
def test_stopped_receiver_fails_at_deadline(kv_factory, fails_at_deadline_while_stopped):
    kv = kv_factory(num_blocks=64, torch_dtype=None)  # 1 MiB through a 2 x 16 KiB ring
    with PeerProcess("rdma-recv", "--ring-slots", "2", "--slot-mb", "0.016") as rx:
        with SharedMemoryKVSender(rx.address) as tx:
            # connected, healthy
            tx.send(kv_factory("warm", num_blocks=1, torch_dtype=None), timeout_s=20)
            rx.line(10)
            fails_at_deadline_while_stopped(lambda t: tx.send(kv, timeout_s=t), rx.pid)


@pytest.mark.slow
def test_silent_peer_fails_at_deadline(kv_factory):
    name = f"pddflow-test-hole-{uuid.uuid4().hex[:8]}"
    hole = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hole.bind("\0" + name)
    hole.listen(4)  # accepts into the backlog, never answers
    try:
        with SharedMemoryKVSender(f"unix:@{name}") as tx:
            t0 = time.monotonic()
            with pytest.raises(ChannelTimeout):
                tx.send(kv_factory(num_blocks=2), timeout_s=1.0)
            assert time.monotonic() - t0 < 5.0
    finally:
        hole.close()


@pytest.mark.slow
def test_receiver_killed_mid_transfer_is_reported(kv_factory):
    kv = kv_factory("rdma-dead", num_blocks=64, torch_dtype=None)
    with PeerProcess(
        "rdma-recv", "--ring-slots", "2", "--slot-mb", "0.016", "--arena-mb", "0"
    ) as rx:
        writes = []

        def kill_on_fifth(offset: int, piece: np.ndarray):
            writes.append(offset)
            if len(writes) == 5:  # mid-transfer: after four 16 KiB ring slots went through
                os.kill(rx.pid, signal.SIGKILL)
                rx.proc.wait(10)
            return None

        params = SharedMemoryKVParams(slot_mb=0.016)
        with FaultyKVSender(rx.address, params=params, fault=kill_on_fifth) as tx:
            with pytest.raises((ChannelClosed, ChannelTimeout)):
                tx.send(kv, timeout_s=10)


def test_receiver_cancel_refuses_the_set(kv_factory):
    kv = kv_factory("rdma-cancel", num_blocks=4, torch_dtype=None)
    with SharedMemoryKVReceiver() as rx, SharedMemoryKVSender(rx.address) as tx:
        rx.cancel("rdma-cancel", reason="request moved")
        with pytest.raises(ChannelCancelled, match="request moved"):
            tx.send(kv, timeout_s=10)
        # the channel still works
        tx.send(kv_factory("rdma-ok", num_blocks=2, torch_dtype=None), timeout_s=10)
        assert rx.recv("rdma-ok", timeout_s=5).num_blocks == 2


def test_arena_memory_returns_when_the_tensor_is_dropped(kv_factory):
    kv = kv_factory("rdma-arena", num_blocks=8, torch_dtype="bfloat16")  # 128 KiB
    params = SharedMemoryKVParams(arena_mb=1)
    with (
        SharedMemoryKVReceiver(params=params) as rx,
        SharedMemoryKVSender(rx.address, params=params) as tx,
    ):
        full = rx.arena_free_bytes()
        tx.send(kv, timeout_s=10)
        got = rx.recv("rdma-arena", timeout_s=5)
        assert tx.last_mode == "direct" and rx.arena_free_bytes() == full - (128 << 10)
        view = got.data[2:4]  # a view keeps the region alive ...
        del got
        assert rx.arena_free_bytes() < full
        del view  # ... and the last reference returns it (the receiver thread may still be
        t0 = time.monotonic()  # leaving the frame that handed the set over: allow it a moment)
        while rx.arena_free_bytes() != full and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        assert rx.arena_free_bytes() == full


def test_cancelled_set_keeps_its_arena_region_until_the_sender_stops(kv_factory):
    """A region the sender is still writing into must not go to another set, even after cancel."""
    kv = kv_factory("rdma-cancel-mid", num_blocks=8, torch_dtype=None)  # 128 KiB
    params = SharedMemoryKVParams(arena_mb=1)
    with SharedMemoryKVReceiver(params=params) as rx:
        full = rx.arena_free_bytes()
        seen = []

        def cancel_mid_write(offset: int, piece: np.ndarray):
            rx.cancel("rdma-cancel-mid", reason="pair failed")
            seen.append(rx.arena_free_bytes())  # the writer is about to write: still reserved
            return None

        with FaultyKVSender(rx.address, params=params, fault=cancel_mid_write) as tx:
            with pytest.raises(ChannelCancelled, match="pair failed"):
                tx.send(kv, timeout_s=10)
        assert seen == [full - (128 << 10)]
        t0 = time.monotonic()
        while rx.arena_free_bytes() != full and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        assert rx.arena_free_bytes() == full  # returned once the sender was done with it


def test_full_arena_falls_back_to_the_ring(kv_factory):
    params = SharedMemoryKVParams(arena_mb=0.25)  # 256 KiB
    with (
        SharedMemoryKVReceiver(params=params) as rx,
        SharedMemoryKVSender(rx.address, params=params) as tx,
    ):
        held = []
        for i in range(3):  # 3 x 128 KiB, kept by the worker: the third no longer fits
            kv = kv_factory(f"hold-{i}", num_blocks=8, torch_dtype=None, seed=i)
            tx.send(kv, timeout_s=10)
            held.append(rx.recv(kv.seq_id, timeout_s=5))
            assert tx.last_mode == ("direct" if i < 2 else "ring")
            assert held[-1].data.tobytes() == kv.data.tobytes()


def test_recv_has_a_deadline():
    with SharedMemoryKVReceiver() as rx:
        with pytest.raises(ChannelTimeout):
            rx.recv(timeout_s=0.2)


def test_unknown_transport_lists_valid_names():
    with pytest.raises(ChannelError, match="valid: auto, nixl, shm"):
        SharedMemoryKVReceiver(params=SharedMemoryKVParams(transport="verbs"))


@pytest.mark.skipif(not NixlBackend.available(), reason="NIXL is not installed here")
def test_nixl_transport_round_trip(kv_factory):
    kv = kv_factory("nixl", num_blocks=8, torch_dtype=None)
    params = SharedMemoryKVParams(transport="nixl")
    with (
        SharedMemoryKVReceiver("tcp:127.0.0.1:0", params=params) as rx,
        SharedMemoryKVSender(rx.address, params=params) as tx,
    ):
        tx.send(kv, timeout_s=30)
        out = rx.recv("nixl", timeout_s=10)
    assert np.array_equal(out.data, kv.data)
