"""The emulated WAN slowed and restored through the admin endpoint, on a real deployment of pdd:
the frontend's measured link estimate (/health links) drops after a degrade and recovers after a
restore, and the scheduler moves new requests to p_rld_md within a bounded number of requests,
then back to p_md. The link's jitter is flat here so that what a transfer measures is the rate,
the SLA rule alone decides (`relay_if_transfer_over_s: 0`), and the TTFT SLA is 2 s so that the
degrade breaks it for a 400-token prompt while the link's estimate still carries some of its
fast past (a 5 s SLA would need a far slower link and minutes of slow requests to get there)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pddflow.bench.deploy_process import DeployProcess, get_json, post_json

pytestmark = pytest.mark.slow  # starts a deployment: worker processes

ROOT = Path(__file__).resolve().parents[2]
DECLARED_GBPS = 0.4  # a 300-token prompt's KV (9.8 MB) crosses in about 0.25 s: p_md
WITHIN = 8  # requests a move may take: each measures the link once
SLA_TTFT_S = 2.0


@pytest.fixture(scope="module")
def pdd(tmp_path_factory) -> Iterator[DeployProcess]:
    d = tmp_path_factory.mktemp("degrade")
    graph = yaml.safe_load((ROOT / "graphs" / "pdd.yaml").read_text())
    # the declared lognormal tail (P99 2 s) would be measured as a slow rate on short transfers
    graph["links"]["A-B"]["jitter"] = {"dist": "constant", "p50_ms": 2, "p99_ms": 2}
    graph["scheduler"]["sla"]["ttft_s"] = SLA_TTFT_S
    # the SLA rule alone: the fixed 0.5 s rule would relay these prompts whenever this shared
    # machine slows the emulated link's sender (it measured 0.18 of the declared 0.4 Gbps in CI)
    graph["scheduler"]["params"] = {"relay_if_transfer_over_s": 0.0}
    (d / "pdd.yaml").write_text(yaml.safe_dump(graph))
    dep = DeployProcess(d / "pdd.yaml", d / "run", "--wan-gbps", str(DECLARED_GBPS))
    yield dep
    out = dep.stop()
    assert dep.leftover_children() == [], out


_numbers = itertools.count()


def ask(dep: DeployProcess, prompt_tokens: int, **extra: object) -> str:
    """One cold request (a fresh prefix: nothing cached anywhere); returns its variant and, after
    a colon, the scheduler's reason (for the assertion messages)."""
    prompt = f"Request {next(_numbers)} of the degrade drill. ".ljust(prompt_tokens, "x")
    body = {"model": "pdd", "prompt": prompt, "max_tokens": 16, "temperature": 0, **extra}
    code, out = post_json(f"{dep.base}/v1/completions", body, timeout=120)
    assert code == 200, out
    code, timeline = get_json(f"{dep.base}/v1/requests/{out['id']}/timeline")
    assert code == 200, timeline
    why = [e.get("reason", "") for e in timeline["events"] if e["event"] == "arrival"]
    return f"{timeline['variant']}: {why[0] if why else ''}"


def estimate(dep: DeployProcess) -> float:
    return dep.health()["links"]["A-B"]["estimated_gbps"]


def test_admin_degrade_is_guarded_and_checked(pdd):
    url = f"{pdd.base}/admin/links/A-B/degrade"
    assert post_json(url, {"gbps": 0.1})[0] == 401  # no admin key
    assert post_json(url, {"gbps": 0.1}, key="not-the-key")[0] == 401
    code, out = post_json(f"{pdd.base}/admin/links/X-Y/degrade", {"gbps": 0.1}, key=pdd.admin_key)
    assert code == 404 and "A-B" in out["error"]["message"], out
    for bad in ({"gbps": 0}, {"gbps": 0.1, "jitter_p99_ms": -1}, {}):
        code, out = post_json(url, bad, key=pdd.admin_key)
        assert code == 400, (bad, out)
    # a degrade that changes nothing reaches every worker that shapes the link
    code, out = pdd.degrade_link("A-B", DECLARED_GBPS, jitter_p99_ms=2)
    assert code == 200, out
    assert set(out["workers"]) == {"prefill/0", "relay/0", "main/0"}
    assert out["workers"]["main/0"] >= 1  # its handoff server's replies cross the link
    assert out["emulated"] == out["declared"], out
    code, out = pdd.restore_link("A-B")
    assert code == 200 and out["emulated"] == out["declared"], out


def test_link_estimate_drops_after_a_degrade_and_recovers_after_a_restore(pdd):
    for _ in range(2):
        ask(pdd, 200, variant="p_md")  # every transfer crosses and is measured
    before = estimate(pdd)
    assert before > DECLARED_GBPS / 4, pdd.health()["links"]
    code, out = pdd.degrade_link("A-B", 0.02)
    assert code == 200 and out["emulated"]["gbps"] == 0.02, out
    for _ in range(WITHIN):
        ask(pdd, 200, variant="p_md")
        if estimate(pdd) < before / 2:
            break
    low = estimate(pdd)
    assert low < before / 2, (before, pdd.health()["links"])
    code, _ = pdd.restore_link("A-B")
    assert code == 200
    recovered = max(before / 2, 2 * low)
    for _ in range(WITHIN):
        ask(pdd, 200, variant="p_md")
        if estimate(pdd) > recovered:
            break
    assert estimate(pdd) > recovered, (before, low, pdd.health()["links"])


def test_requests_move_to_the_relay_when_the_link_slows_and_back_after(pdd):
    """The policy decides (no variant asked): p_md while the link is fast (a 400-token prompt's
    KV, 13 MB, crosses in about 0.3 s); after the degrade to 0.03 Gbps (about 3.5 s) the estimate
    falls until p_md's predicted TTFT breaks the SLA and the relay hides the WAN; after the
    restore, p_md again."""
    fast = _until(pdd, "p_md")
    assert fast[-1].startswith("p_md:"), (fast, pdd.health()["links"])
    code, _ = pdd.degrade_link("A-B", 0.03)
    assert code == 200
    seen = _until(pdd, "p_rld_md")
    assert seen[-1].startswith("p_rld_md:"), (seen, pdd.health()["links"])
    code, _ = pdd.restore_link("A-B")
    assert code == 200
    back = _until(pdd, "p_md")
    assert back[-1].startswith("p_md:"), (back, pdd.health()["links"])


def _until(dep: DeployProcess, variant: str) -> list[str]:
    """Requests, at most WITHIN, until one takes `variant`: each one's variant and reason."""
    seen: list[str] = []
    while len(seen) < WITHIN and not (seen and seen[-1].startswith(f"{variant}:")):
        seen.append(ask(dep, 400))
    return seen
