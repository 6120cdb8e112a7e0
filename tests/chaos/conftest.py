"""A real deployment of PDD over a slow emulated WAN, for fault drills: one for the whole chaos
suite (each test leaves it serving again: that is what the drills assert), started once because a
start costs about 10 s of the suite's 20 minutes. It is graphs/pdd_tiered.yaml served as `pdd`:
main has host-memory and disk tiers under its cache, so every drill runs over them too and a main
killed -9 restarts from its disk tier. It serves with two API processes (deploy --api-servers 2):
the workers stream each request's tokens to the process holding its connection, so every drill
also proves the fault rules for requests whose tokens never pass through the router."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess
from pddflow.testing import chaos
from pddflow.testing.chaos import greedy_reference

ROOT = Path(__file__).resolve().parents[2]
WAN_GBPS = "0.05"
LEASE_S = 4  # a 360-token prompt's KV (11 MB) takes about 2 s to cross


@pytest.fixture(scope="session")
def pdd(tmp_path_factory):
    graph = tmp_path_factory.mktemp("graph") / "pdd.yaml"
    tiered = (ROOT / "graphs" / "pdd_tiered.yaml").read_text()
    tiered = tiered.replace("name: pdd_tiered\n", "name: pdd\n", 1)
    # a short lease, so that the partition drills' 8 s splits outlast it (test_partitions.py)
    graph.write_text(
        tiered.replace("\nscheduler:\n", f"\ndeploy: {{lease_s: {LEASE_S}}}\n\nscheduler:\n", 1)
    )
    # two API processes: the drills hold for requests whose tokens skip the router
    dep = DeployProcess(
        graph, tmp_path_factory.mktemp("chaos"), "--wan-gbps", WAN_GBPS, "--api-servers", "2"
    )
    yield dep
    out = dep.stop()
    assert dep.leftover_children() == [], out
    assert not (dep.run_dir / "kv").exists(), out  # the disk tier does not persist: no file left


@pytest.fixture(autouse=True)
def all_up(request):
    """Each drill starts on a deployment whose workers are all up: one before may end while a
    worker it cut off is still reconnecting (a WAN cut cuts main's control connections too)."""
    if "pdd" in request.fixturenames:
        request.getfixturevalue("pdd").wait_ready()


@pytest.fixture(scope="session")
def reference():
    return greedy_reference()


@pytest.fixture
def wait_until() -> Callable[[str, Callable[[], object], float], object]:
    return chaos.wait_until
