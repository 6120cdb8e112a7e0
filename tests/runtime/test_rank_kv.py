"""Rank-to-rank KV between tensor-parallel instances of different degrees: which rank sends which
heads where (any pair of degrees, heads shared past the KV heads), pieces joined per receiving
rank in any order, and real rdma_tensor sends of the pieces (a set that loses one rank's
connection fails as a whole). The deployed path: test_deploy_tensor_parallel.py."""

from __future__ import annotations

import time

import pytest
import torch

from pddflow.channels.errors import ChannelError
from pddflow.channels.rdma_tensor.protocol import SharedMemoryKVParams
from pddflow.channels.rdma_tensor.receiver import SharedMemoryKVReceiver
from pddflow.channels.rdma_tensor.sender import SharedMemoryKVSender
from pddflow.core.payloads import KVBlocks
from pddflow.operators.kv_shards import HeadRoute, head_routes, kv_heads, kv_owners
from pddflow.runtime.workers.rank_kv import ShardAssembler, joined, planned_bytes, send_shards

DEGREES = [(2, 1), (1, 4), (4, 2), (2, 4), (4, 4), (1, 1), (8, 2), (2, 8)]


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4, 8])
@pytest.mark.parametrize("src, dst", DEGREES)
def test_every_receiving_rank_gets_exactly_its_heads_once(num_kv_heads, src, dst):
    routes = head_routes(num_kv_heads, src, dst)
    owners = set(kv_owners(num_kv_heads, src))
    for r in range(dst):
        got = sorted((h.lo, h.hi) for h in routes if h.dst == r)
        a, b = kv_heads(num_kv_heads, dst, r)
        covered = [h for lo, hi in got for h in range(lo, hi)]
        assert covered == list(range(a, b)), (r, got)
    for h in routes:
        assert h.src in owners  # a head two sending ranks share is sent once
        c, d = kv_heads(num_kv_heads, src, h.src)
        assert c <= h.lo < h.hi <= d


def test_routes_of_the_deployed_layouts():
    # 2 KV heads: prefill 2 -> relay 1, prefill 1 -> relay 2, main 4 shares each head on 2 ranks
    assert head_routes(2, 2, 1) == [HeadRoute(0, 0, 0, 1), HeadRoute(1, 0, 1, 2)]
    assert head_routes(2, 1, 2) == [HeadRoute(0, 0, 0, 1), HeadRoute(0, 1, 1, 2)]
    assert [(h.src, h.dst, h.lo) for h in head_routes(2, 4, 2)] == [(0, 0, 0), (2, 1, 1)]
    assert [(h.src, h.dst, h.lo) for h in head_routes(2, 1, 4)] == [
        (0, 0, 0),
        (0, 1, 0),
        (0, 2, 1),
        (0, 3, 1),
    ]


def _kv(heads: int, blocks: int = 3, token_end: int = 40) -> KVBlocks:
    data = torch.randn(blocks, 2, 2, 16, heads, 8)
    return KVBlocks("seq-1", [11, 22, 33][:blocks], 0, token_end, 16, data)


def test_pieces_join_in_any_order_and_strays_are_refused():
    whole = _kv(4)
    rank = ShardAssembler((0, 4), ttl_s=5)
    pieces = [
        KVBlocks(**{**whole.__dict__, "data": whole.data[..., lo:hi, :], "heads": (lo, hi)})
        for lo, hi in [(2, 4), (0, 1), (1, 2)]
    ]
    assert rank.add(pieces[0]) is None and rank.add(pieces[1]) is None
    got, n = rank.add(pieces[2])
    assert n == 3 and got.heads == (0, 4) and torch.equal(got.data, whole.data)
    with pytest.raises(ChannelError, match=r"heads \[2, 4\) of seq-1 reached the rank holding"):
        ShardAssembler((0, 2), ttl_s=5).add(pieces[0])


def test_a_newer_send_starts_over_and_stale_pieces_expire():
    rank = ShardAssembler((0, 2), ttl_s=0.2)
    old, new = _kv(2, token_end=40), _kv(2, token_end=48)
    rank.put(KVBlocks(**{**old.__dict__, "data": old.data[..., :1, :], "heads": (0, 1)}))
    rank.put(KVBlocks(**{**new.__dict__, "data": new.data[..., 1:, :], "heads": (1, 2)}))
    assert rank.take("seq-1", 0) is None  # the old piece does not join the new one
    rank.put(KVBlocks(**{**new.__dict__, "data": new.data[..., :1, :], "heads": (0, 1)}))
    assert torch.equal(rank.take("seq-1", 0), new.data)
    rank.put(KVBlocks(**{**new.__dict__, "data": new.data[..., :1, :], "heads": (0, 1)}))
    assert rank.pending() == 1
    time.sleep(0.3)
    rank.put(KVBlocks(**{**_kv(2).__dict__, "seq_id": "other", "heads": (0, 1)}))
    assert rank.pending() == 1  # seq-1's lone piece expired; "other"'s waits


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_one_sending_rank_feeds_two_receiving_ranks(transport):
    """TP 1 -> TP 2 over real rdma_tensor receivers: each receiving rank's receiver gets just its
    heads (checksummed per piece over tcp) and joins them into its shard of the KV."""
    params = SharedMemoryKVParams(transport=transport, deadline_s=5)
    address = None if transport == "shm" else "tcp:127.0.0.1:0"
    receivers = [SharedMemoryKVReceiver(address, params=params) for _ in range(2)]
    senders = [SharedMemoryKVSender(r.address, params=params) for r in receivers]
    try:
        kv = _kv(2)
        kv.heads = (0, 2)
        futures = send_shards(kv, 2, (1, 0), 2, lambda dst: senders[dst], timeout_s=5)
        report = joined(futures, planned_bytes(kv, 1000, 2, (1, 2))).result(timeout=10)
        assert report.bytes == 3 * 1000
        for r, rx in enumerate(receivers):
            piece = rx.recv(timeout_s=5)
            assert piece.heads == (r, r + 1) and piece.data.shape[4] == 1
            got, n = ShardAssembler((r, r + 1), ttl_s=5).add(piece)
            assert n == 1 and torch.equal(torch.as_tensor(got.data), kv.data[..., r : r + 1, :])
    finally:
        for s in senders:
            s.close()
        for rx in receivers:
            rx.close()


def test_a_lost_rank_connection_fails_the_whole_send():
    """The second receiving rank is gone: the send of the set fails within its deadline, though
    the first rank's piece went through (the receiving leader then lacks a rank's heads and
    recomputes: KVShardMissing, test_engine_tp_group.py)."""
    params = SharedMemoryKVParams(deadline_s=2)
    rx = SharedMemoryKVReceiver(params=params)
    senders = [
        SharedMemoryKVSender(rx.address, params=params),
        SharedMemoryKVSender("unix:@pddflow-test-no-such-rank", params=params),
    ]
    try:
        kv = _kv(2)
        kv.heads = (0, 2)
        t = time.monotonic()
        fut = joined(send_shards(kv, 2, (1, 0), 2, lambda dst: senders[dst], 2), 0)
        with pytest.raises(ChannelError):
            fut.result(timeout=10)
        assert time.monotonic() - t < 5
        assert rx.recv(timeout_s=5).heads == (0, 1)
    finally:
        for s in senders:
            s.close()
        rx.close()
