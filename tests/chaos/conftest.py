"""A real deployment of graphs/pdd.yaml over a slow emulated WAN, for fault drills: one for the
whole chaos suite (each test leaves it serving again: that is what the drills assert), started
once because a start costs about 10 s of the suite's 20 minutes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess
from pddflow.testing import chaos
from pddflow.testing.chaos import greedy_reference

ROOT = Path(__file__).resolve().parents[2]
WAN_GBPS = "0.05"  # a 360-token prompt's KV (11 MB) takes about 2 s to cross


@pytest.fixture(scope="session")
def pdd(tmp_path_factory):
    dep = DeployProcess(
        ROOT / "graphs" / "pdd.yaml", tmp_path_factory.mktemp("chaos"), "--wan-gbps", WAN_GBPS
    )
    yield dep
    out = dep.stop()
    assert dep.leftover_children() == [], out


@pytest.fixture(scope="session")
def reference():
    return greedy_reference()


@pytest.fixture
def wait_until() -> Callable[[str, Callable[[], object], float], object]:
    return chaos.wait_until
