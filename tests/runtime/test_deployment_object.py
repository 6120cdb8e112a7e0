"""The `Deployment` object driven from a test, as `pddflow deploy` drives it: refusals before
anything starts, then start, serve (in a thread), a request whose greedy tokens are the colocated
reference's, the drain, and a stop that leaves no worker and no run directory."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest

from pddflow.graph import load_plan
from pddflow.graph.shipped import resolve_graph
from pddflow.runtime.deploy.deployment import (
    DeployError,
    Deployment,
    DeployOptions,
    OptionError,
)
from pddflow.testing.chaos import greedy_reference

PROMPT = "The Deployment object serves this."
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def plan():
    return load_plan(str(resolve_graph("pdd")))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (DeployOptions(backend="k8s"), "unknown backend 'k8s'; backends: local, ray"),
        (DeployOptions(address="ray://x:10001"), "--address is for --backend ray"),
    ],
)
def test_an_option_that_cannot_work_is_refused_before_anything_starts(plan, options, named):
    with pytest.raises(OptionError, match=named):
        Deployment(plan, options)


def test_a_model_that_cannot_load_is_refused_naming_the_option(plan, tmp_path):
    with pytest.raises(DeployError, match="--model: ") as exc:
        Deployment(plan, DeployOptions(model=str(tmp_path / "nowhere")))
    assert not isinstance(exc.value, OptionError)


def test_the_plan_is_what_runs_here(plan):
    d = Deployment(plan, DeployOptions(wan_gbps=0.25))
    assert d.plan.profile == "local" and len(d.plan.instances) == 3
    assert {link.gbps for link in d.plan.links.values()} == {0.25}
    assert d.plan.model.weights == "builtin:tiny-llama" and d.model.vocab_size > 0
    assert d.backend_name == "local" == plan.deploy.backend


def test_a_pool_wired_for_live_scaling(plan):
    """local.max_replicas wires the pool's bound and starts local.replicas, on either backend."""
    from dataclasses import replace

    scalable = replace(plan, local_max_replicas={"main": 3})
    d = Deployment(scalable, DeployOptions())
    assert d.plan.operators["main"].instances == ("main/0", "main/1", "main/2")
    assert d.plan.initial_instances() == ["prefill/0", "relay/0", "main/0"]
    assert len(d.plan.instances) == 5 and d.plan.scalable()
    assert Deployment(scalable, DeployOptions(backend="ray")).plan.scalable()


def test_a_pool_change_starts_or_stops_only_what_it_must():
    """Down from 3 of 10 to 1 stops the two highest and starts nothing (a negative slice once
    started 5 parked instances while it shrank a pool: pools of more than 2 only)."""
    from pddflow.runtime.deploy.deployment import pool_moves

    pool = tuple(f"main/{i}" for i in range(10))
    parked = set(pool[3:])
    assert pool_moves(pool, parked, 1) == ([], ["main/2", "main/1"])
    assert pool_moves(pool, parked, 5) == (["main/3", "main/4"], [])
    assert pool_moves(pool, parked, 3) == ([], [])


@pytest.mark.slow  # starts three worker processes
def test_start_serve_and_stop(plan, tmp_path):
    from pddflow.core.payloads import SamplingParams

    eng = greedy_reference().engine
    ids = eng.tokenizer.encode(PROMPT)
    greedy = SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=eng.tokenizer.eos_token_ids)
    want = eng.generate([ids], greedy)[0].output_ids

    d = Deployment(plan, DeployOptions(port=0, drain_timeout_s=5.0))
    d.start()
    pids = list(d.backend.pids().values())
    run_dir = d.run_dir
    server = threading.Thread(target=d.serve, kwargs={"say": lambda _: None}, daemon=True)
    server.start()
    try:
        base = d.url.removesuffix("/v1")
        deadline = time.monotonic() + 30
        while True:  # the server thread binds nothing new: the socket listens already
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the API did not come up"
            time.sleep(0.1)
        for variant in ("p_rld_md", "p_md"):
            body = {
                "model": "pdd",
                "prompt": ids,
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "return_token_ids": True,
                "variant": variant,
            }
            r = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["token_ids"] == want, variant
        d.stop_serving()
        server.join(timeout=30)
        assert not server.is_alive(), "serve() did not return after stop_serving()"
    finally:
        d.stop()
    assert not run_dir.exists()
    # the workers were this process's children, stopped and reaped
    assert [pid for pid in pids if os.path.exists(f"/proc/{pid}")] == []
