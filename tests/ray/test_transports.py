"""Which transport each rdma_tensor pair of instances gets from where the instances run, and how
/health says it when an operator's instances are split over hosts (no Ray, no processes)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pddflow.graph import load_plan
from pddflow.runtime.transports import channel_label, incoming, pair, routes
from pddflow.runtime.wiring import wire

ROOT = Path(__file__).resolve().parents[2]


def _plan(relays: int = 1, **params):
    plan = load_plan(str(ROOT / "graphs" / "pdd.yaml"))
    plan = replace(plan, local_replicas={**plan.local_replicas, "relay": relays}).scaled_to_local()
    chans = tuple(
        replace(c, params={**c.params, **params}) if c.kind == "rdma_tensor" else c
        for c in plan.channels
    )
    return replace(plan, channels=chans)


def _edge(plan):
    return next(c for c in plan.channels if c.kind == "rdma_tensor")


def test_auto_is_shared_memory_on_one_host_else_nixl_where_installed_else_tcp():
    plan = _plan()
    same = {"prefill/0": "10.0.0.1", "relay/0": "10.0.0.1"}
    split = {"prefill/0": "10.0.0.1", "relay/0": "10.0.0.2"}
    assert routes(plan, {}, nixl=True) == {pair("prefill/0", "relay/0"): "shm"}
    assert routes(plan, same, nixl=True) == {pair("prefill/0", "relay/0"): "shm"}
    assert routes(plan, split, nixl=False) == {pair("prefill/0", "relay/0"): "tcp"}
    assert routes(plan, split, nixl=True) == {pair("prefill/0", "relay/0"): "nixl"}
    assert routes(_plan(transport="tcp"), same, nixl=True)[pair("prefill/0", "relay/0")] == "tcp"
    with pytest.raises(ValueError, match="transport shm needs prefill/0 and relay/0 on one host"):
        routes(_plan(transport="shm"), split, nixl=False)


def test_split_relays_are_named_per_receiver():
    plan = _plan(relays=2)
    host_of = {"prefill/0": "10.0.0.1", "relay/0": "10.0.0.1", "relay/1": "10.0.0.2"}
    rdma = routes(plan, host_of, nixl=False)
    assert channel_label(plan, _edge(plan), rdma, host_of) == (
        "shared memory to relay/0, tcp (cross-host, checksummed) to relay/1"
    )
    assert incoming(rdma, "relay/0") == {"shm"} and incoming(rdma, "relay/1") == {"tcp"}


def test_local_wiring_gives_a_receiver_only_the_addresses_its_senders_use():
    w = wire(_plan())
    assert (
        w.workers["relay/0"].kv_rdma.startswith("unix:@") and not w.workers["relay/0"].kv_rdma_net
    )
    w = wire(_plan(transport="tcp"))
    relay = w.workers["relay/0"]
    assert not relay.kv_rdma and relay.kv_rdma_net.startswith("tcp:127.0.0.1:")
    assert w.rdma == {pair("prefill/0", "relay/0"): "tcp"}
