"""The relay an emulated link's connections cross (channels/link_relay.py): a partition holds what
is sent, both ways or one, and delivers it in order when it heals, without resetting the
connection; a lossy link delays pieces by TCP's retransmission timeout; a control relay adds the
link's one-way delay."""

from __future__ import annotations

import socket
import time

import pytest

from pddflow.channels.link_relay import RTO_MIN_S, Link, LinkRelay


def _round_trip(sock: socket.socket, payload: bytes, timeout_s: float = 10.0) -> float:
    t = time.monotonic()
    sock.sendall(payload)
    got = b""
    sock.settimeout(timeout_s)
    while len(got) < len(payload):
        got += sock.recv(65536)
    assert got == payload
    return time.monotonic() - t


def _relay(echo, **kw) -> LinkRelay:
    return LinkRelay(echo, client_cluster="A", server_cluster="B", **kw)


def test_a_partition_holds_data_and_delivers_it_when_it_heals(echo):
    with _relay(echo) as relay, socket.create_connection(("127.0.0.1", relay.port)) as s:
        assert _round_trip(s, b"before") < 0.5
        relay.link.impair(0.6)
        took = _round_trip(s, b"x" * 200_000)  # same connection: not reset
        assert took >= 0.5
        assert relay.stats.cuts == 0
        assert _round_trip(s, b"after") < 0.5


@pytest.mark.parametrize("lost_from", ["A", "B"])
def test_a_one_way_split_holds_only_its_direction(echo, lost_from):
    with _relay(echo) as relay, socket.create_connection(("127.0.0.1", relay.port)) as s:
        relay.link.impair(0.6, from_cluster=lost_from)
        assert _round_trip(s, b"ping") >= 0.5  # an echo crosses both directions
        relay.link.impair(0.6, from_cluster="C")  # neither end: nothing is lost
        assert _round_trip(s, b"ping") < 0.3


def test_a_lossy_link_costs_retransmission_timeouts(echo):
    with _relay(echo, seed=3) as relay, socket.create_connection(("127.0.0.1", relay.port)) as s:
        relay.link.impair(30, loss=0.5)
        took = _round_trip(s, b"y" * (64 << 10) * 8)  # 16 pieces crossing, each may be lost
        assert took >= RTO_MIN_S  # some of them were
        relay.link.impair(0.01, loss=0.5)
        time.sleep(0.02)
        assert _round_trip(s, b"healed") < 0.3


def test_a_control_relay_adds_the_links_one_way_delay(echo):
    with (
        _relay(echo, delay_s=0.1, control=True) as relay,
        socket.create_connection(("127.0.0.1", relay.port)) as s,
    ):
        assert 0.2 <= _round_trip(s, b"rtt") < 1.0


def test_impairments_are_checked():
    with pytest.raises(ValueError, match="loss"):
        Link().impair(1.0, loss=0)
