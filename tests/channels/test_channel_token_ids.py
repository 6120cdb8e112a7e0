"""token_ids over real sockets (server in a child process where the test allows): per-sequence
order and acks, TLS + token, reconnect and resend after a dropped connection, control messages
both ways, deadlines on a silent peer."""

from __future__ import annotations

import time

import pytest

from pddflow.channels.errors import ChannelAuthError, ChannelTimeout
from pddflow.channels.link_relay import LinkRelay
from pddflow.channels.token_ids.client import TokenIdsClient
from pddflow.channels.token_ids.codec import Control, ControlKind
from pddflow.channels.token_ids.protocol import TokenIdsParams
from pddflow.channels.token_ids.server import TokenIdsServer
from pddflow.core.link import Jitter, LinkModel
from pddflow.core.payloads import TokenIds
from pddflow.testing.faults import BlackHole
from pddflow.testing.peer import PeerProcess

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def secure_srv(tls_dir):
    p = PeerProcess(
        "tok-server",
        "--token",
        TOKEN,
        "--tls-cert",
        tls_dir.cert_chain,
        "--tls-key",
        tls_dir.private_key,
    )
    yield p
    p.stop()


def _drain(peer: PeerProcess, n: int) -> list[dict]:
    return [peer.line(10) for _ in range(n)]


@pytest.mark.slow
def test_handoffs_arrive_in_order_with_acks_over_tls(secure_srv, tls_dir, no_pickle):
    params = TokenIdsParams(token=TOKEN, tls=tls_dir)
    with TokenIdsClient(secure_srv.address, params=params, name="relay-0") as cli:
        futs = []
        for i in range(20):  # two sequences interleaved, pipelined (acks come back later)
            for seq in ("a", "b"):
                futs.append(
                    cli.send_async(
                        TokenIds(seq, i * 4, [i, i + 1, i + 2, i + 3], final=i == 19), timeout_s=10
                    )
                )
        for f in futs:
            f.result(timeout=15)
        cli.send(Control(ControlKind.RELEASE, "a", "extend done"), timeout_s=10)
    lines = _drain(secure_srv, 41)
    for seq in ("a", "b"):
        got = [m["tokens"] for m in lines if "tokens" in m and m["tokens"]["seq_id"] == seq]
        assert [t["start"] for t in got] == [i * 4 for i in range(20)]
        assert got[-1]["final"] and all(t["peer"] == "relay-0" for t in got)
    assert lines[-1] == {
        "control": {"peer": "relay-0", "kind": "release", "seq_id": "a", "reason": "extend done"}
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "token, expect", [(None, "missing bearer token"), ("guess", "wrong bearer token")]
)
def test_missing_or_wrong_token_is_refused(secure_srv, tls_dir, token, expect):
    with TokenIdsClient(secure_srv.address, params=TokenIdsParams(token=token, tls=tls_dir)) as cli:
        with pytest.raises(ChannelAuthError, match=expect):
            cli.send(TokenIds("x", 0, [1]), timeout_s=10)


@pytest.mark.slow
def test_dropped_connection_reconnects_and_resends_exactly_once():
    with PeerProcess("tok-server") as srv:
        host, port = srv.address.split(":")
        with (
            LinkRelay((host, int(port))) as relay,
            TokenIdsClient(
                relay.address, params=TokenIdsParams(deadline_s=30), name="relay-1"
            ) as cli,
        ):
            futs = [cli.send_async(TokenIds("s", i, [1000 + i]), timeout_s=30) for i in range(150)]
            while sum(f.done() for f in futs) < 40:
                time.sleep(0.001)
            relay.drop_all()  # the link flaps with messages in flight
            futs += [
                cli.send_async(TokenIds("s", i, [1000 + i]), timeout_s=30) for i in range(150, 300)
            ]
            for f in futs:
                f.result(timeout=40)
            assert relay.stats.connections >= 2
        starts = [m["tokens"]["start"] for m in _drain(srv, 300)]
    assert starts == list(range(300))  # every message once, in order, despite resends


def test_control_both_ways_in_process():
    with TokenIdsServer() as srv, TokenIdsClient(srv.address, name="relay-2") as cli:
        cli.send(TokenIds("r1", 0, [5, 6, 7]), timeout_s=5)
        m = srv.recv(timeout_s=5)
        assert m.peer == "relay-2" and m.payload.ids == [5, 6, 7]
        srv.send("relay-2", Control(ControlKind.CANCEL, "r1", "MD lost the KV"), timeout_s=5)
        back = cli.recv(timeout_s=5)
        assert (
            back.payload == Control(ControlKind.CANCEL, "r1", "MD lost the KV")
            and back.peer == "server"
        )


@pytest.mark.slow
def test_silent_peer_fails_at_deadline():
    with BlackHole() as hole, TokenIdsClient(hole.address) as cli:
        t0 = time.monotonic()
        with pytest.raises(ChannelTimeout):
            cli.send(TokenIds("x", 0, [1]), timeout_s=1.0)
        assert time.monotonic() - t0 < 5.0


def test_unreachable_peer_for_server_send_times_out():
    with TokenIdsServer() as srv:
        with pytest.raises(ChannelTimeout):
            srv.send("nobody", TokenIds("x", 0, [1]), timeout_s=0.3)
        with pytest.raises(ChannelTimeout):
            srv.recv(timeout_s=0.2)


def test_emulated_link_delays_each_direction():
    """Both ends shape with the link model: a round trip takes at least the link's RTT."""
    link = LinkModel("A-B", "A", "B", gbps=1.0, rtt_ms=40.0, jitter=Jitter(5.0, 20.0))
    with (
        TokenIdsServer(params=TokenIdsParams(emulate=link, seed=1)) as srv,
        TokenIdsClient(srv.address, params=TokenIdsParams(emulate=link, seed=1)) as cli,
    ):
        cli.connect(timeout_s=10)
        t0 = time.monotonic()
        cli.send(TokenIds("e", 0, list(range(100))), timeout_s=10)
        assert time.monotonic() - t0 >= 0.040  # one way each: rtt/2 + jitter >= 5 ms, twice
        assert srv.recv(timeout_s=5).payload.ids == list(range(100))


@pytest.mark.slow
def test_send_async_never_blocks_and_fails_at_its_deadline():
    with BlackHole() as hole, TokenIdsClient(hole.address) as cli:
        t0 = time.monotonic()
        fut = cli.send_async(TokenIds("x", 0, [1]), timeout_s=1.0)
        assert time.monotonic() - t0 < 0.5  # queued, not connecting in the caller's thread
        with pytest.raises(ChannelTimeout):
            fut.result(timeout=10)
        assert time.monotonic() - t0 < 5.0


def test_send_async_auth_refusal_reaches_the_future():
    with (
        TokenIdsServer(params=TokenIdsParams(token=TOKEN)) as srv,
        TokenIdsClient(srv.address, params=TokenIdsParams(token="nope")) as cli,
    ):
        with pytest.raises(ChannelAuthError, match="wrong bearer token"):
            cli.send_async(TokenIds("x", 0, [1]), timeout_s=5).result(timeout=10)


def test_send_async_waits_for_a_server_that_starts_later():
    import socket as _s

    probe = _s.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with TokenIdsClient(f"127.0.0.1:{port}") as cli:
        fut = cli.send_async(TokenIds("late", 0, [9]), timeout_s=10)
        time.sleep(0.3)
        with TokenIdsServer(port=port) as srv:
            fut.result(timeout=15)
            assert srv.recv(timeout_s=5).payload.ids == [9]
