"""Forged control messages against a live deployment are refused and change nothing; a short
soak of mixed requests leaves no KV block, memory or descriptor growth behind."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from pddflow.bench.deploy_process import post_json
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.rpc import Credentials, WorkerClient, open_reports
from pddflow.runtime.wiring import Wiring

pytestmark = pytest.mark.slow


def complete(dep, prompt: str, n: int, **extra) -> tuple[int, dict]:
    body = {"model": "pdd", "prompt": prompt, "max_tokens": n, "temperature": 0}
    return post_json(
        f"{dep.base}/v1/completions", {**body, "return_token_ids": True, **extra}, timeout=60
    )


def test_forged_reports_and_aborts_are_refused(pdd, reference):
    wiring = json.loads((pdd.run_dir / "wiring.json").read_text())
    forger = Credentials("not-the-token")
    prompt, n = "A victim request that forgers try to hijack.", 24
    got: dict = {}
    victim = threading.Thread(
        target=lambda: got.update(answer=complete(pdd, prompt, n, variant="p_rld_md"))
    )
    victim.start()
    refused = 0
    clients = [WorkerClient(ep["rpc"], forger) for ep in wiring["workers"].values()]
    for _ in range(20):  # request ids are the server's secret too; the token is what is checked
        for client in clients:
            try:
                client.call("Abort", pb.Cancel(seq_id="*"), timeout_s=5)
            except grpc.RpcError as err:
                refused += err.code() == grpc.StatusCode.UNAUTHENTICATED
        text = pb.TokenBatch(tokens=[pb.Tokens(seq_id="*", start=0, ids=[1, 2, 3], final=True)])
        fut = open_reports(
            wiring["frontend"], iter([pb.Report(instance="main/0", tokens=text)]), forger
        )
        try:
            fut.result(timeout=5)
        except grpc.RpcError as err:
            refused += err.code() == grpc.StatusCode.UNAUTHENTICATED
    victim.join(60)
    for client in clients:
        client.close()
    assert refused == 20 * (len(wiring["workers"]) + 1)
    code, out = got["answer"]
    assert code == 200 and out["choices"][0]["token_ids"] == reference(prompt, n)


def test_orphaned_leg_is_aborted(pdd, wait_until):
    """A leg whose request the frontend does not know (its abort was lost) is aborted within
    seconds, not held to its deadline."""

    def legs() -> int:
        return pdd.health()["workers"]["main/0"]["legs"]

    wiring = Wiring.load(pdd.run_dir / "wiring.json")
    client = WorkerClient(wiring.workers["main/0"].rpc, wiring.credentials())
    order = pb.LegOrder(
        seq_id="orphan-1",
        prompt_ids=list(range(3, 67)),
        sampling=pb.Sampling(max_tokens=8),
        timeout_s=300,  # waits for KV that no prefill sends
        variant="p_md",
        prefill="prefill/0",
        main="main/0",
    )
    # the forgery drill's victim: main's copy of its turn may still be crossing the slow WAN
    assert pdd.wait_idle(timeout_s=90)["workers"]["main/0"]["legs"] == 0
    # the drills before may have left orphans too (a WAN cut also cuts main's control
    # connections: the frontend carries its requests on, and main's legs are reaped)
    aborted = pdd.metric("pddflow_orphan_legs_aborted_total", instance="main/0")
    try:
        client.call("Submit", order, timeout_s=5)
        wait_until("main/0 holds the leg", lambda: legs() == 1, 5)
        wait_until("the orphan is aborted", lambda: legs() == 0, 20)
    finally:
        client.close()
    assert pdd.metric("pddflow_orphan_legs_aborted_total", instance="main/0") == aborted + 1


def _rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_soak_leaves_nothing_behind(pdd, reference):
    insts = ("prefill/0", "relay/0", "main/0")

    def sample() -> dict[str, tuple[int, int]]:
        return {i: (_rss_kb(p := pdd.worker_pid(i)), _fds(p)) for i in insts}

    routes = [("p_md", None), ("p_rld_md", "one_shot"), ("p_rld_md", "catch_up"), (None, None)]

    def one(k: int) -> bool:
        variant, handoff = routes[k % len(routes)]
        extra = {k2: v for k2, v in (("variant", variant), ("handoff", handoff)) if v}
        prompt = f"soak turn {k % 6}: " + "context " * (8 + k % 5)
        code, out = complete(pdd, prompt, 12, **extra)
        return code == 200 and out["choices"][0]["token_ids"] == reference(prompt, 12)

    with ThreadPoolExecutor(4) as pool:  # warm up: the first requests grow caches and pools
        assert all(pool.map(one, range(8)))
    before = sample()
    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(one, range(32)))
    # main's copies of turns the relay finished may still be crossing the slow WAN
    h = pdd.wait_idle(timeout_s=90)
    after = sample()
    assert h["live_requests"] == 0
    for inst, w in h["workers"].items():
        assert w["kv_blocks_used"] == w["cached_blocks"], (inst, w)  # only caches hold blocks
        assert w["legs"] == 0, (inst, w)
    for inst in insts:
        (rss0, fd0), (rss1, fd1) = before[inst], after[inst]
        assert fd1 - fd0 <= 8, (inst, fd0, fd1)
        assert rss1 - rss0 < 150_000, (inst, rss0, rss1)  # KB: no growth per request
