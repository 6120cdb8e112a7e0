"""A decoder admits landed KV only when the request can run to its last token: with more
concurrent requests than its KV memory holds, the rest wait for room instead of failing
mid-decode; a request that could never fit is refused at once (400), saying why."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess, get_json, post_json

pytestmark = pytest.mark.slow  # starts a deployment: worker processes

ROOT = Path(__file__).resolve().parents[2]


def test_requests_wait_for_kv_memory_instead_of_failing(tmp_path):
    # 8 MiB per worker: 16 blocks of 16 tokens (32 KiB of KV per token). Each request needs
    # ceil((64 + 40) / 16) = 7 blocks on main, so main holds two at a time.
    dep = DeployProcess(
        ROOT / "graphs" / "cross_dc_pd.yaml", tmp_path / "run", "--kv-cache-mb", "8"
    )
    try:
        model = get_json(f"{dep.base}/v1/models")[1]["data"][0]["id"]

        def ask(i: int, max_tokens: int = 40) -> tuple[int, dict, str]:
            prompt = [(7 * i + 3 * j) % 250 for j in range(64)]
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "return_token_ids": True,
                "stop": None,
            }
            req = urllib.request.Request(
                f"{dep.base}/v1/completions",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read()), r.headers["x-request-id"]

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(ask, range(4)))
        assert [code for code, _, _ in results] == [200] * 4
        assert all(len(out["choices"][0]["token_ids"]) > 0 for _, out, _ in results)
        waited = 0
        for _, _, rid in results:
            tl = get_json(f"{dep.base}/v1/requests/{rid}/timeline")[1]
            names = [e["event"] for e in tl["events"]]
            assert "leg_failed" not in names, tl["events"]
            waited += "kv_waits_for_memory" in names
        assert waited >= 1  # four did not fit at once: some waited, none failed

        prompt = list(range(64))
        code, out = post_json(
            f"{dep.base}/v1/completions",
            {"model": model, "prompt": prompt, "max_tokens": 300, "temperature": 0},
            timeout=60,
        )
        # it could never fit main's memory: refused at once, before any worker ran it
        message = out["error"]["message"]
        assert code == 400 and "max_tokens (300)" in message and "holds 16" in message, out
        health = get_json(f"{dep.base}/health")[1]
        assert health["max_tokens_in_flight"] == 16 * 16  # what a request can hold: blocks x 16
    finally:
        dep.stop()
    assert dep.leftover_children() == []
