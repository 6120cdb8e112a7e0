"""A deployment of graphs/pdd.yaml as shipped, shared by the modules that only send it requests
(test_deploy_pdd.py, test_openai_logprobs.py): a start costs about 10 s of the suite's 20
minutes. Modules that count its metrics from zero, fault it or start it otherwise start their
own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def shipped_pdd(tmp_path_factory):
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    dep = DeployProcess(ROOT / "graphs" / "pdd.yaml", tmp_path_factory.mktemp("pdd-run"))
    yield dep
    out = dep.stop()
    assert dep.leftover_children() == [], out
    # rdma_tensor maps memfd regions (gone with their processes); nothing may stay in /dev/shm
    if os.path.isdir("/dev/shm"):
        assert set(os.listdir("/dev/shm")) - shm_before == set()
