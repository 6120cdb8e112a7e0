"""Datacenter partitions (pddflow/testing/partition.py): the link between A (frontend, prefill,
relay) and B (main) split both ways, one way, or lossy, while requests are in the WAN KV transfer,
the handoff, decoding on main, or arriving. The chaos deployment's lease is 4 s (conftest), so a
2 s split is one the lease rides out and a 6.5 s split one it does not: the same two classes as
benchmarks/chaos.py's 5 s and 60 s against the default 10 s lease."""

from __future__ import annotations

import pytest

from pddflow.testing.partition import Fault, partition_drill

pytestmark = pytest.mark.slow

WITHIN = Fault("split 2 s (within the lease)", 2.0)
# a two-way split lapses both sides on their own (no grants reach main, no answers come back);
# a one-way split of B's sends has the frontend revoke a lease main still hears renewed. A's
# sends lost is the two-way case for the leases (main's reports still arrive): benchmarks/chaos.py
BEYOND = [
    Fault("split 6.5 s (past the lease)", 6.5),
    Fault("one-way 6.5 s: B's sends lost", 6.5, from_cluster="B"),
]
LOSSY = Fault("20% loss for 5 s", 5.0, loss=0.2)


def _check(res) -> None:
    detail = f"{res.to_dict()}"
    assert res.wrong == 0 and res.hung == 0, detail
    assert res.exact + res.typed_errors == res.sent, detail
    assert res.slowest_s <= res.deadline_s, detail  # no client waits past its deadline
    assert res.back_s is not None, detail  # main serves again after the heal
    assert res.blocks_leaked == 0 and res.mirror_drift == 0, detail


def test_a_split_within_the_lease_costs_only_the_wait(pdd, reference):
    res = partition_drill(pdd, WITHIN, reference)
    _check(res)
    assert res.exact == res.sent, res.to_dict()  # every request rides it out
    assert res.around_s is None, res.to_dict()  # main was never given up


@pytest.mark.parametrize("fault", BEYOND, ids=lambda f: f.name)
def test_a_split_past_the_lease_is_routed_around_and_healed(pdd, reference, fault):
    res = partition_drill(pdd, fault, reference)
    _check(res)
    assert res.around_s is not None and res.around_s < fault.seconds, res.to_dict()
    assert res.routed_around, res.to_dict()  # served without main while it was unreachable
    lapses = pdd.metric("pddflow_lease_lapses_total", instance="main/0")
    assert lapses >= 1


def test_a_lossy_link_loses_no_request(pdd, reference):
    _check(partition_drill(pdd, LOSSY, reference))
