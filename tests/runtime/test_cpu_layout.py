"""How a local deployment splits the host's cores: clusters never share cores when the host has
enough, instances get their own when it has more, and nothing is pinned otherwise."""

from __future__ import annotations

import pytest

from pddflow.core.cpu_layout import DECODE_NICE, layout

PDD = [("prefill/0", "A", "prefill"), ("relay/0", "A", "decode"), ("main/0", "B", "decode")]


def _cores_of(lay, cluster_members):
    return set().union(*(set(lay.cpus[i]) for i in cluster_members))


def test_two_cores_one_per_cluster():
    lay = layout(PDD, [0, 1])
    assert lay.mode == "cluster"
    assert lay.cpus == {"prefill/0": (0,), "relay/0": (0,), "main/0": (1,)}
    assert lay.threads == {"prefill/0": 1, "relay/0": 1, "main/0": 1}
    # the relay shares prefill's core at a lower priority; main has its core to itself
    assert lay.nice == {"prefill/0": 0, "relay/0": DECODE_NICE, "main/0": 0} and DECODE_NICE > 0


@pytest.mark.parametrize("n", [3, 4, 7, 16, 64])
def test_enough_cores_every_instance_its_own(n):
    lay = layout(PDD, list(range(100, 100 + n)))
    assert lay.mode == "instance"
    sets = [set(c) for c in lay.cpus.values()]
    # disjoint, all used
    assert all(sets) and sum(len(s) for s in sets) == n and len(set().union(*sets)) == n
    assert all(lay.threads[i] == len(lay.cpus[i]) for i, _, _ in PDD) and set(
        lay.nice.values()
    ) == {0}
    # cluster A has two instances, B one: A gets about two thirds of the cores
    assert abs(len(_cores_of(lay, ["prefill/0", "relay/0"])) - 2 * n / 3) <= 1


def test_one_cluster_shares_nothing_across_clusters_because_there_is_one():
    lay = layout([("prefill/0", "A", "prefill"), ("decode/0", "A", "decode")], [0, 1])
    assert lay.cpus == {"prefill/0": (0,), "decode/0": (1,)} and set(lay.nice.values()) == {0}


def test_fewer_cores_than_clusters_or_none_pins_nothing():
    for lay in (layout(PDD, [0]), layout(PDD, list(range(8)), "none")):
        assert lay.mode == "shared" and all(c == () for c in lay.cpus.values())
    assert layout(PDD, list(range(8)), "none").threads == {i: 2 for i, _, _ in PDD}


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="auto, none"):
        layout(PDD, [0, 1], "fast")


def test_two_decoders_sharing_cores_without_prefill_keep_their_priority():
    lay = layout([("a/0", "A", "decode"), ("a/1", "A", "decode"), ("b/0", "B", "decode")], [0, 1])
    assert lay.mode == "cluster" and set(lay.nice.values()) == {0}


def test_every_rank_process_of_a_tensor_parallel_instance_gets_its_share():
    """The local profile's layout: prefill 2 ranks, main 2; each rank is pinned like an instance
    (the leader goes by the instance's name, a follower by `instance#rank`)."""
    from dataclasses import replace

    from pddflow.core.cpu_layout import plan_layout
    from pddflow.graph import load_plan
    from pddflow.graph.shipped import resolve_graph

    plan = load_plan(str(resolve_graph("pdd")))
    plan = replace(plan, local_devices={"prefill": 2, "relay": 1, "main": 2}).scaled_to_local()
    assert plan.rank_processes("prefill/0") == ["prefill/0", "prefill/0#1"]
    assert plan.rank_processes("relay/0") == ["relay/0"]
    lay = plan_layout(plan, list(range(6)))
    assert list(lay.cpus) == ["prefill/0", "prefill/0#1", "relay/0", "main/0", "main/0#1"]
    assert lay.mode == "instance" and all(lay.cpus.values())
    a = _cores_of(lay, ["prefill/0", "prefill/0#1", "relay/0"])
    assert a.isdisjoint(_cores_of(lay, ["main/0", "main/0#1"]))
