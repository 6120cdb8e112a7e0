"""The local backend's link process (runtime/deploy/link_process.py): relays started in a process
of their own carry bytes, a cut there resets the link's connections, a bad command is refused with
its reason, and the process ends when the deployer's handle stops it."""

from __future__ import annotations

import socket

import pytest

from pddflow.runtime.deploy.link_process import LinkProcess, RelaySpec


def _round_trip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    got = b""
    sock.settimeout(10)
    while len(got) < len(payload):
        piece = sock.recv(65536)
        if not piece:
            break
        got += piece
    return got


def test_relays_in_their_own_process_carry_bytes_and_obey_cuts(echo):
    upstream = "{}:{}".format(*echo)
    specs = [RelaySpec("wan", upstream, "A", "B"), RelaySpec("wan", upstream, "B", "A", 0.001)]
    lp = LinkProcess(specs)
    try:
        assert len(lp.addresses) == 2 and lp.links == ["wan"]
        host, port = lp.addresses[0].rsplit(":", 1)
        with socket.create_connection((host, int(port))) as s:
            assert _round_trip(s, b"x" * 300_000) == b"x" * 300_000
            lp.cut("wan", 0.2)
            with pytest.raises(OSError):  # reset by the cut (the reply came before it)
                _round_trip(s, b"after the cut")
        with pytest.raises(ValueError, match="loss must be in"):
            lp.impair("wan", 1.0, loss=2.0, from_cluster=None)
        with pytest.raises(ValueError, match="nowhere"):
            lp.cut("nowhere", 1.0)
        lp.impair("wan", 0.1, loss=1.0, from_cluster="A")  # accepted
    finally:
        lp.stop()
    assert lp.proc.poll() is not None
