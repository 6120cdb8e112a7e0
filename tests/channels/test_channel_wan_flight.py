"""wan_flight over real sockets, receivers in child processes: bit-exact round trips, TLS + token
auth, resume after a killed connection, corrupt blocks resent, deadlines on a silent peer."""

from __future__ import annotations

import time

import pytest

from pddflow.channels.errors import ChannelAuthError, ChannelCancelled, ChannelError, ChannelTimeout
from pddflow.channels.link_relay import LinkRelay
from pddflow.channels.wan_flight.params import WanFlightParams
from pddflow.channels.wan_flight.receiver import WanFlightReceiver
from pddflow.channels.wan_flight.sender import WanFlightSender
from pddflow.testing.faults import BlackHole, FaultyRelay
from pddflow.testing.peer import PeerProcess

TOKEN = "s3cret-token"
MARKER = b"PDD!MARK"


@pytest.fixture(scope="module")
def secure_rx(tls_dir):
    p = PeerProcess(
        "wan-recv",
        "--token",
        TOKEN,
        "--tls-cert",
        tls_dir.cert_chain,
        "--tls-key",
        tls_dir.private_key,
    )
    yield p
    p.stop()


@pytest.fixture(scope="module")
def plain_rx():
    p = PeerProcess("wan-recv")
    yield p
    p.stop()


@pytest.mark.slow
@pytest.mark.parametrize("torch_dtype", ["bfloat16", None])
def test_round_trip_bit_exact_over_tls_with_token(
    secure_rx, tls_dir, kv_factory, same_kv, no_pickle, torch_dtype
):
    kv = kv_factory("tls-" + str(torch_dtype), num_blocks=40, torch_dtype=torch_dtype)
    params = WanFlightParams(streams=3, token=TOKEN, tls=tls_dir, max_batch_bytes=64 << 10)
    assert secure_rx.address.startswith("grpc+tls://")
    with WanFlightSender(secure_rx.address, params=params) as tx:
        report = tx.send(kv, timeout_s=30)
    assert report.bytes == 40 * (16 << 10) and report.resent_blocks == 0  # 40 blocks of 16 KiB
    same_kv(kv, secure_rx.line(10)["kv"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "token, expect", [(None, "missing bearer token"), ("guess", "wrong bearer token")]
)
def test_missing_or_wrong_token_is_refused(secure_rx, tls_dir, kv_factory, token, expect):
    kv = kv_factory(num_blocks=2)
    with WanFlightSender(secure_rx.address, params=WanFlightParams(token=token, tls=tls_dir)) as tx:
        with pytest.raises(ChannelAuthError, match=expect):
            tx.send(kv, timeout_s=10)
        with pytest.raises(ChannelAuthError, match="refused our credentials"):
            tx.ping(timeout_s=10)


@pytest.mark.slow
def test_connection_killed_mid_transfer_resumes(plain_rx, kv_factory, same_kv):
    kv = kv_factory("resume", num_blocks=256, torch_dtype=None)
    total = 256 * (16 << 10)  # 4 MiB in 16 KiB blocks
    host, port = plain_rx.address.removeprefix("grpc://").split(":")
    with LinkRelay((host, int(port))) as relay:
        relay.cut(0, after_bytes=int(total * 0.6))
        params = WanFlightParams(streams=2, max_batch_bytes=64 << 10)
        with WanFlightSender(f"grpc://{relay.address}", params=params) as tx:
            report = tx.send(kv, timeout_s=60)
        assert relay.stats.cuts == 1 and report.reconnects >= 1
        # resumed, not restarted: well under the 1.6x a restart from block 0 would move
        assert relay.stats.up_bytes < 1.45 * total
    same_kv(kv, plain_rx.line(10)["kv"])


@pytest.mark.slow
def test_corrupt_block_is_detected_and_resent(plain_rx, kv_factory, same_kv):
    kv = kv_factory("corrupt", num_blocks=32, torch_dtype=None, marker=MARKER, marker_block=9)
    host, port = plain_rx.address.removeprefix("grpc://").split(":")
    with FaultyRelay((host, int(port)), corrupt_marker=MARKER) as relay:
        params = WanFlightParams(streams=1, max_batch_bytes=64 << 10)
        with WanFlightSender(f"grpc://{relay.address}", params=params) as tx:
            report = tx.send(kv, timeout_s=30)
        assert relay.corruptions == 1
    assert report.resent_blocks == 1  # block 9, rejected by its CRC, sent again
    same_kv(kv, plain_rx.line(10)["kv"])  # and what landed is the original


@pytest.mark.slow
def test_parallel_streams_use_separate_connections(plain_rx, kv_factory, same_kv):
    kv = kv_factory("streams", num_blocks=128, torch_dtype=None)  # 2 MiB in 32 runs of 64 KiB
    host, port = plain_rx.address.removeprefix("grpc://").split(":")
    with LinkRelay((host, int(port))) as relay:
        params = WanFlightParams(streams=4, max_batch_bytes=64 << 10)
        with WanFlightSender(f"grpc://{relay.address}", params=params) as tx:
            tx.connect(timeout_s=10)
            tx.send(kv, timeout_s=30)
        assert relay.stats.connections >= 4  # one TCP connection per stream
        carried = [n for n in relay.stats.per_connection_up if n > 64 << 10]
        assert len(carried) >= 2  # and the blocks really went over several of them
    same_kv(kv, plain_rx.line(10)["kv"])


@pytest.mark.slow
def test_slow_stream_takes_less_work(plain_rx, kv_factory, same_kv):
    """Streams pull runs from a shared queue: a throttled connection carries well under its 1/4."""
    kv = kv_factory("slow-path", num_blocks=256, torch_dtype=None)  # 4 MiB in 64 runs of 64 KiB
    host, port = plain_rx.address.removeprefix("grpc://").split(":")
    with FaultyRelay((host, int(port)), throttle={0: 1 << 20}) as relay:  # connection 0: 1 MiB/s
        params = WanFlightParams(streams=4, max_batch_bytes=64 << 10)
        with WanFlightSender(f"grpc://{relay.address}", params=params, ack_window=2) as tx:
            tx.connect(timeout_s=10)
            tx.send(kv, timeout_s=60)
        share = relay.stats.per_connection_up[0] / sum(relay.stats.per_connection_up)
    assert share < 0.15, share
    same_kv(kv, plain_rx.line(10)["kv"])


@pytest.mark.slow
def test_silent_peer_fails_at_deadline(kv_factory):
    kv = kv_factory(num_blocks=4)
    with BlackHole() as hole, WanFlightSender(f"grpc://{hole.address}") as tx:
        t0 = time.monotonic()
        with pytest.raises(ChannelTimeout):
            tx.send(kv, timeout_s=1.5)
        elapsed = time.monotonic() - t0
    assert 1.4 <= elapsed < 6.0  # at the deadline, not forever


@pytest.mark.slow
def test_stopped_receiver_process_fails_at_deadline(kv_factory, fails_at_deadline_while_stopped):
    kv = kv_factory(num_blocks=64, torch_dtype=None)
    with PeerProcess("wan-recv") as rx:
        with WanFlightSender(rx.address) as tx:
            tx.ping(timeout_s=10)  # connected and healthy ...
            # ... then it stops
            fails_at_deadline_while_stopped(lambda t: tx.send(kv, timeout_s=t), rx.pid)


def test_receiver_cancel_refuses_the_sequence(kv_factory):
    kv = kv_factory("doomed", num_blocks=4, torch_dtype=None)
    with WanFlightReceiver() as rx, WanFlightSender(rx.address) as tx:
        rx.cancel("doomed", reason="relay finished it")
        with pytest.raises(ChannelCancelled, match="relay finished it"):
            tx.send(kv, timeout_s=10)
        with pytest.raises(ChannelCancelled):
            rx.recv("doomed", timeout_s=0.5)


def test_sender_cancel_frees_receiver_state(kv_factory):
    kv = kv_factory("gone", num_blocks=4, torch_dtype=None)
    with WanFlightReceiver() as rx, WanFlightSender(rx.address) as tx:
        tx.send(kv, timeout_s=10)
        tx.cancel("gone", reason="paired leg failed")
        with pytest.raises(ChannelCancelled, match="paired leg failed"):
            rx.recv("gone", timeout_s=0.5)


def test_message_size_limits_on_both_sides(kv_factory):
    # 128 KiB blocks
    kv = kv_factory("big-blocks", num_blocks=8, torch_dtype=None, layers=16, head_dim=64)
    with WanFlightReceiver(params=WanFlightParams(max_message_bytes=256 << 10)) as rx:
        with WanFlightSender(rx.address, params=WanFlightParams(max_message_bytes=64 << 10)) as tx:
            with pytest.raises(ChannelError, match="over the message limit"):
                tx.send(kv, timeout_s=10)  # sender side: one block cannot fit a message
        params = WanFlightParams(max_message_bytes=8 << 20, max_batch_bytes=1 << 20)
        with WanFlightSender(rx.address, params=params) as tx:
            with pytest.raises(ChannelError, match="exceeds the receiver's message limit"):
                tx.send(kv, timeout_s=10)  # receiver side: a 1 MiB batch is refused


def test_recv_has_a_deadline():
    with WanFlightReceiver() as rx:
        with pytest.raises(ChannelTimeout):
            rx.recv(timeout_s=0.2)
