"""The WAN cut mid-transfer and black-holed after N bytes: the KV transfer resumes (or main
recomputes the KV) and the request returns exactly the reference tokens in bounded time."""

from __future__ import annotations

import threading
import time

import pytest

from pddflow.bench.deploy_process import post_json

pytestmark = pytest.mark.slow

LONG = "The link drops while the KV is on it. " * 10  # ~380 tokens


def wan_bytes(dep) -> float:
    return dep.metric("pddflow_wan_bytes_sent_total")


def ask(dep, prompt: str, n: int, out: dict, **extra) -> None:
    body = {"model": "pdd", "prompt": prompt, "max_tokens": n, "temperature": 0}
    t0 = time.monotonic()
    out["answer"] = post_json(
        f"{dep.base}/v1/completions", {**body, "return_token_ids": True, **extra}, timeout=60
    )
    out["seconds"] = time.monotonic() - t0


def test_the_link_is_measured(pdd, reference):
    """Before any fault: a cold prompt's KV over the 0.05 Gbps link measures about that rate."""
    got, prompt = {}, "Measure the link. " + LONG
    ask(pdd, prompt, 4, got, variant="p_md")
    code, out = got["answer"]
    assert code == 200 and out["choices"][0]["token_ids"] == reference(prompt, 4)
    link = pdd.health()["links"]["A-B"]  # the model is the emulated link (--wan-gbps)
    assert link["measurements"] >= 1
    assert 0.3 * link["model_gbps"] < link["estimated_gbps"] < 2 * link["model_gbps"], link
    assert link["transfer_p90_s"] > 0
    assert pdd.metric("pddflow_link_estimated_gbps", link="A-B") == link["estimated_gbps"]


def test_link_cut_mid_transfer(pdd, reference, wait_until):
    want, got = reference(LONG, 8), {}
    before = wan_bytes(pdd)
    t = threading.Thread(target=ask, args=(pdd, LONG, 8, got), kwargs={"variant": "p_md"})
    t.start()
    wait_until("the KV transfer started", lambda: wan_bytes(pdd) > before, 30)
    code, _ = pdd.cut_link("A-B", 2)
    assert code == 200
    t.join(60)
    code, out = got["answer"]
    assert code == 200 and out["choices"][0]["token_ids"] == want, out
    assert got["seconds"] < 40  # the channel's 30 s deadline bounds it, with recovery after


def test_black_hole_after_bytes_then_recovery(pdd, reference):
    code, _ = pdd.cut_link("A-B", 4, after_bytes=1_000_000)
    assert code == 200
    prompt = "Black-holed a megabyte in. " * 14
    got: dict = {}
    ask(pdd, prompt, 8, got, variant="p_rld_md", handoff="catch_up")
    code, out = got["answer"]
    assert code == 200 and out["choices"][0]["token_ids"] == reference(prompt, 8), out
    assert got["seconds"] < 40
    # the link is back: a new request crosses it normally
    again: dict = {}
    ask(pdd, "after the outage", 8, again, variant="p_md")
    code, out = again["answer"]
    assert code == 200 and out["choices"][0]["token_ids"] == reference("after the outage", 8)
