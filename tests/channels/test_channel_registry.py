"""The transport registry: graph params (as pddflow.core.channel_kinds declares them) become each
transport's params, with the deployment's TLS material and the plan's link supplied by the runtime."""

from __future__ import annotations

import pytest

from pddflow.channels.registry import TRANSPORTS
from pddflow.channels.security import TLSConfig
from pddflow.core.channel_kinds import CHANNEL_KINDS
from pddflow.core.link import Jitter, LinkModel
from pddflow.core.registry import UnknownName

LINK = LinkModel("A-B", "A", "B", gbps=100, rtt_ms=30, jitter=Jitter(50, 2000))


def test_every_networked_core_kind_has_a_transport():
    assert {k for k in CHANNEL_KINDS.names() if CHANNEL_KINDS.get(k).scope != "process"} <= set(
        TRANSPORTS.names()
    )


def test_graph_params_become_transport_params(monkeypatch):
    tls = TLSConfig("c.pem", "k.pem", "c.pem")
    wan = TRANSPORTS.get("wan_flight").make_params(
        {"streams": 8, "tls": True, "token": "", "deadline_s": 12.5, "emulate": True},
        tls=tls,
        link=LINK,
    )
    assert (wan.streams, wan.tls, wan.token, wan.deadline_s, wan.emulate) == (
        8,
        tls,
        None,
        12.5,
        LINK,
    )
    monkeypatch.setenv("PDD_TOKEN", "from-env")
    tok = TRANSPORTS.get("token_ids").make_params(
        {"token_env": "PDD_TOKEN", "emulate": False}, link=LINK
    )
    assert tok.token == "from-env" and tok.emulate is None
    rdma = TRANSPORTS.get("rdma_tensor").make_params(
        {"ring_slots": 8, "slot_mb": 64, "deadline_s": 30}
    )
    assert rdma.slot_bytes == 64 << 20


def test_bad_params_are_explained():
    with pytest.raises(ValueError, match="did you mean 'streams'"):
        TRANSPORTS.get("wan_flight").make_params({"stream": 2})
    with pytest.raises(ValueError, match="no certificates"):
        TRANSPORTS.get("token_ids").make_params({"tls": True})
    with pytest.raises(UnknownName, match="did you mean 'wan_flight'"):
        TRANSPORTS.get("wan_flite")
