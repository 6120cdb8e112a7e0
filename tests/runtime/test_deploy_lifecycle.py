"""A deployment's lifecycle on a live `pddflow deploy graphs/pdd.yaml` with its default run
directory: private and cleaned up (also a dead deployer's), a client that hangs up on a
non-streamed request cancels it, and SIGTERM / SIGINT drain with a bound (docs/runtime.md,
Stopping).

A request that stays in flight for sure: variant p_md with the A-B link slowed to a crawl. Its
first token comes from main, whose KV crosses that link, so it waits for the WAN's deadline (30 s),
whatever the machine's speed."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import pytest

from pddflow.bench.deploy_process import DeployProcess, get_json, post_json
from pddflow.runtime.deploy.run_dir import OWNER_FILE, RUN_DIR_PREFIX, WIRING_FILE

pytestmark = pytest.mark.slow  # starts deployments: worker processes

ROOT = Path(__file__).resolve().parents[2]
GRAPH = ROOT / "graphs" / "pdd.yaml"
STUCK = {"model": "pdd", "prompt": "waits for main", "max_tokens": 4, "variant": "p_md"}


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _requests_total(dep: DeployProcess, outcome: str, variant: str) -> float:
    text = urllib.request.urlopen(f"{dep.base}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("pddflow_requests_total{") and f'outcome="{outcome}"' in line:
            if f'variant="{variant}"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def _cut_link(dep: DeployProcess) -> None:
    """The WAN down to a crawl for the KV (12.5 KB/s): the control plane, which crosses the link
    too, still reaches main, so main waits for the KV instead of being routed around."""
    code, out = dep.degrade_link("A-B", 1e-4)
    assert code == 200, out


def _wait_live(dep: DeployProcess, n: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while dep.health()["live_requests"] < n:
        assert time.monotonic() < deadline, dep.health()
        time.sleep(0.05)


def _exit(dep: DeployProcess, timeout_s: float = 60.0) -> tuple[int, str]:
    out, _ = dep.proc.communicate(timeout=timeout_s)
    return dep.proc.returncode, out.decode(errors="replace")


def _post_in_thread(url: str, body: dict, into: dict, key: str) -> threading.Thread:
    def run() -> None:
        into[key] = post_json(url, body, timeout=120)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.fixture(scope="module")
def tmpdir_(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tmpdir")


@pytest.fixture(scope="module")
def stale(tmpdir_) -> dict[str, Path]:
    """Run directories left by earlier deployers, before this module's deployment starts."""
    out = {}
    for name, marker in (
        ("dead", f"{_dead_pid()} 1\n"),  # killed with SIGKILL: its directory stayed
        ("unmarked", None),  # not ours to judge
    ):
        d = tmpdir_ / f"{RUN_DIR_PREFIX}{name}"
        d.mkdir()
        (d / WIRING_FILE).write_text('{"auth_token": "old"}')
        if marker:
            (d / OWNER_FILE).write_text(marker)
        out[name] = d
    return out


@pytest.fixture(scope="module")
def dep(tmpdir_, stale):
    d = DeployProcess(GRAPH, None, "--drain-timeout", "3", tmpdir=tmpdir_)
    yield d
    if d.proc.poll() is None:  # a test failed before it stopped the deployment
        d.stop()
    assert d.leftover_children() == []


def test_run_dir_is_private_and_stale_ones_are_gone(dep, stale):
    rd = dep.run_dir
    assert rd is not None and rd.name.startswith(RUN_DIR_PREFIX)
    assert stat.S_IMODE(rd.stat().st_mode) == 0o700
    assert stat.S_IMODE((rd / WIRING_FILE).stat().st_mode) == 0o600
    assert int((rd / OWNER_FILE).read_text().split()[0]) == dep.proc.pid
    assert not stale["dead"].exists() and stale["unmarked"].exists()


def test_client_gone_cancels_a_non_streamed_request(dep):
    """D6: the request is cancelled everywhere and counted `cancelled`, not decoded to its end and
    counted `ok` (before, it stayed live until main's KV gave up and then finished)."""
    _cut_link(dep)
    before = _requests_total(dep, "cancelled", "p_md")
    ok_before = _requests_total(dep, "ok", "p_md")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
        httpx.post(f"{dep.base}/v1/completions", json=STUCK, timeout=2.0)
    h = dep.wait_idle(timeout_s=20)
    assert h["live_requests"] == 0, h
    assert _requests_total(dep, "cancelled", "p_md") == before + 1
    assert _requests_total(dep, "ok", "p_md") == ok_before


def test_client_gone_cancels_a_streamed_request(dep):
    """Before its first token (the API watches for the disconnect), and mid-stream (Starlette
    does)."""
    _cut_link(dep)
    before = {v: _requests_total(dep, "cancelled", v) for v in ("p_md", "p_rld_md")}
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream(
            "POST", f"{dep.base}/v1/completions", json={**STUCK, "stream": True}, timeout=2.0
        ) as r:
            r.read()
    # greedy: "go on" runs 4000 tokens without EOS; sampled, EOS (1 in 259 tokens of the
    # built-in model) could end it as a success before the disconnect is seen
    long = {"model": "pdd", "prompt": "go on", "max_tokens": 4000, "variant": "p_rld_md"}
    long["temperature"] = 0
    with httpx.stream(
        "POST", f"{dep.base}/v1/completions", json={**long, "stream": True}, timeout=60
    ) as r:
        assert next(line for line in r.iter_lines() if line.startswith("data: "))
    h = dep.wait_idle(timeout_s=20)
    assert h["live_requests"] == 0, h
    for v, n in before.items():
        assert _requests_total(dep, "cancelled", v) == n + 1, v


def test_sigterm_drains_then_aborts_what_is_left(dep):
    """Last in this module: it stops the deployment. A streamed request running at SIGTERM
    finishes; a new one gets 503; the stuck one is aborted with a 503 after the 3 s drain; then
    the deployer exits and its run directory is gone."""
    _cut_link(dep)
    got: dict = {}
    stuck = _post_in_thread(f"{dep.base}/v1/completions", STUCK, got, "stuck")
    _wait_live(dep, 1)
    body = {
        "model": "pdd",
        "prompt": "the relay finishes this one",
        "max_tokens": 24,
        "temperature": 0,
        "variant": "p_rld_md",  # the relay's KV does not cross the cut link
        "stream": True,
        "return_token_ids": True,
    }
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{dep.base}/v1/completions", json=body) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            dep.proc.send_signal(signal.SIGTERM)  # while this stream runs
            code, refused = post_json(f"{dep.base}/v1/completions", {"model": "pdd", "prompt": "x"})
            assert code == 503 and "shutting down" in refused["error"]["message"], refused
            assert get_json(f"{dep.base}/health")[1]["status"] == "draining"
            rest = [line for line in lines if line.startswith("data: ")]
    assert first and rest[-1] == "data: [DONE]"
    assert '"finish_reason": "length"' in rest[-2]  # all 24 tokens, then the end
    stuck.join(timeout=60)
    code, out = got["stuck"]
    assert code == 503 and "drain timeout (3 s" in out["error"]["message"], out
    assert out["error"]["type"] == "server_error"
    rc, log = _exit(dep)
    assert rc == 0, log
    assert "aborted 1 request still running" in log
    assert not dep.run_dir.exists()


def test_second_interrupt_stops_at_once(tmp_path):
    dep = DeployProcess(GRAPH, None, "--drain-timeout", "600", tmpdir=tmp_path)
    try:
        rd = dep.run_dir
        _cut_link(dep)
        got: dict = {}
        stuck = _post_in_thread(f"{dep.base}/v1/completions", STUCK, got, "stuck")
        _wait_live(dep, 1)
        dep.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while get_json(f"{dep.base}/health")[1]["status"] != "draining":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        dep.proc.send_signal(signal.SIGINT)  # the drain would wait 600 s: not this one
        stuck.join(timeout=60)
        code, out = got["stuck"]
        assert code == 503 and "stopped at once" in out["error"]["message"], out
        rc, log = _exit(dep)
        assert rc == 0 and "Traceback" not in log, log
        assert not rd.exists() and not list(tmp_path.glob(f"{RUN_DIR_PREFIX}*"))
        assert dep.leftover_children() == []
    finally:
        if dep.proc.poll() is None:
            dep.proc.kill()
            dep.proc.wait()


def test_failed_start_removes_its_run_dir(tmp_path):
    """An exception on the way (here: workers not ready within --startup-timeout) still cleans."""
    p = subprocess.run(
        [sys.executable, "-m", "pddflow.cli", "deploy", str(GRAPH), "--startup-timeout", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert p.returncode == 1 and re.search(r"became ready within 1 s", p.stderr + p.stdout)
    assert list(tmp_path.iterdir()) == []
