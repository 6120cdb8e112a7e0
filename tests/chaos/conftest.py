"""A real deployment of graphs/pdd.yaml over a slow emulated WAN, for fault drills."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pddflow.runtime.launcher import Deployment
from pddflow.testing.chaos import greedy_reference

ROOT = Path(__file__).resolve().parents[2]
WAN_GBPS = "0.05"  # a 360-token prompt's KV (11 MB) takes about 2 s to cross


@pytest.fixture(scope="module")
def pdd(tmp_path_factory):
    dep = Deployment(
        ROOT / "graphs" / "pdd.yaml", tmp_path_factory.mktemp("chaos"), "--wan-gbps", WAN_GBPS
    )
    yield dep
    out = dep.stop()
    assert dep.leftover_children() == [], out


@pytest.fixture(scope="module")
def reference():
    return greedy_reference()


@pytest.fixture
def wait_until() -> Callable[[str, Callable[[], object], float], object]:
    return _wait_until


def _wait_until(what: str, pred: Callable[[], object], timeout_s: float) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.2)
