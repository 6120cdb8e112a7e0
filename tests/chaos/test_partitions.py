"""Datacenter partitions (pddflow/testing/partition.py) made by the local backend's link relays:
the link between A (frontend, prefill, relay) and B (main) split one way, or lossy, while requests
are in the WAN KV transfer, the handoff, decoding on main, or arriving. The chaos deployment's
lease is 4 s (conftest), so a 6.5 s split is one it does not ride out. The two-way splits, within
the lease and past it, run on a real kernel link: tests/ray/test_ray_deploy.py takes the veth
pair between its two datacenters' namespaces down. benchmarks/chaos.py runs every kind here at the
default 10 s lease (5 s and 60 s splits, either way one-way)."""

from __future__ import annotations

import pytest

from pddflow.testing.partition import Fault, assert_settled, partition_drill

pytestmark = pytest.mark.slow

# B's sends lost: main still hears its lease renewed, the frontend hears nothing back and revokes
# it. A's sends lost is the two-way case for the leases (main's reports still arrive).
ONE_WAY = Fault("one-way 6.5 s: B's sends lost", 6.5, from_cluster="B")
LOSSY = Fault("20% loss for 5 s", 5.0, loss=0.2)


def test_a_one_way_split_past_the_lease_is_routed_around_and_healed(pdd, reference):
    res = partition_drill(pdd, ONE_WAY, reference)
    assert_settled(res)
    assert res.around_s is not None and res.around_s < ONE_WAY.seconds, res.to_dict()
    assert res.routed_around, res.to_dict()  # served without main while it was unreachable
    assert pdd.metric("pddflow_lease_lapses_total", instance="main/0") >= 1


def test_a_lossy_link_loses_no_request(pdd, reference):
    assert_settled(partition_drill(pdd, LOSSY, reference))
