"""Live scaling of a pool on a deployment (docs/runtime.md, Live scaling): graphs/pdd.yaml with
`local.max_replicas: {main: 2}` starts one main and wires two. POST /admin/pools/main scales main
to 2 (the new instance starts and joins routing) and back to 1 while a request streams on the
instance being drained: it finishes with the colocated reference's tokens, and the instance's
process is gone. Bounds, unknown pools and a missing admin key are refused. The deployment runs
the modeled engine, its steps 4x their modeled time so a request streams long enough to be caught
mid-drain (everything scaling touches is the runtime's; tests/ray scales the real engine)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess, get_json, post_json
from pddflow.testing.chaos import GreedyReference

pytestmark = pytest.mark.slow  # a deployment: worker processes

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["An elastic pool grows.", "And shrinks again, while a request still streams."]
LONG = 200  # tokens: a request still streaming when its instance is killed mid-drain


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("elastic")
    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    replicas = "replicas: {prefill: 1, relay: 1, main: 1}"
    assert replicas in text
    text = text.replace(replicas, replicas + "\n  max_replicas: {main: 2}")
    graph = tmp / "pdd.yaml"
    graph.write_text(text)
    d = DeployProcess(graph, tmp / "run", "--engine", "modeled", "--time-scale", "4")
    yield d
    d.stop()
    assert d.leftover_children() == []


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    return GreedyReference(engine="modeled").many(PROMPTS, 60)


def _scale(dep, operator: str, replicas, key: str | None = "admin") -> tuple[int, dict]:
    key = dep.admin_key if key == "admin" else key
    url = f"{dep.base}/admin/pools/{operator}"
    return post_json(url, {"replicas": replicas}, timeout=120, key=key)


def _complete(dep, prompt: str, variant: str, max_tokens: int, served: list | None = None):
    """The greedy tokens; `served` gets the instances that streamed them (the timeline's)."""
    body = {
        "model": "pdd",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
        "variant": variant,
    }
    code, out = post_json(f"{dep.base}/v1/completions", body, timeout=120)
    assert code == 200, out
    if served is not None:
        _, timeline = get_json(f"{dep.base}/v1/requests/{out['id']}/timeline")
        served += [e["instance"] for e in timeline["events"] if "instance" in e]
    return out["choices"][0]["token_ids"]


def test_a_pool_grows_and_shrinks_without_losing_a_request(dep, reference):
    pool = dep.health()["pools"]["main"]
    assert pool == {"serving": 1, "max": 2, "instances": {"main/0": "up", "main/1": "parked"}}
    assert dep.metric("pddflow_pool_instances", operator="main", state="parked") == 1
    before = set(dep.health()["workers"])

    code, out = _scale(dep, "main", 2)
    assert code == 200, out
    assert out == {"serving": 2, "max": 2, "instances": {"main/0": "up", "main/1": "up"}}
    assert dep.worker_pid("main/1") > 0 and set(dep.health()["workers"]) == before

    # main/0 busy with a long request: the scheduler sends the next one to main/1 (least load)
    long = threading.Thread(target=_complete, args=(dep, PROMPTS[0], "p_md", 60))
    long.start()
    deadline = time.monotonic() + 30
    while dep.health()["workers"]["main/0"].get("running", 0) < 1:  # its status says so
        assert time.monotonic() < deadline, dep.health()
        time.sleep(0.05)
    served: list[str] = []
    got = _complete(dep, PROMPTS[1], "p_md", 60, served)
    long.join()
    assert got == reference[PROMPTS[1]]
    assert "main/1" in served  # the new instance took it: the least loaded

    # shrink while a request streams: main/1 holds the prompt's blocks, so the scheduler sends
    # it there again, and draining main/1 waits for it (or, past the drain, it moves on)
    results: list[list[int]] = []
    on: list[str] = []
    streaming = threading.Thread(
        target=lambda: results.append(_complete(dep, PROMPTS[1], "p_rld_md", 60, on))
    )
    streaming.start()
    deadline = time.monotonic() + 30
    while dep.health()["workers"]["main/1"].get("legs", 0) < 1:  # main/1 holds it now
        assert time.monotonic() < deadline, dep.health()
        time.sleep(0.02)
    code, out = _scale(dep, "main", 1)
    streaming.join()
    assert code == 200, out
    assert out == {"serving": 1, "max": 2, "instances": {"main/0": "up", "main/1": "parked"}}
    assert results == [reference[PROMPTS[1]]]
    assert "main/1" in on  # it was on the instance drained, and finished there
    assert _complete(dep, PROMPTS[0], "p_md", 60) == reference[PROMPTS[0]]
    health = dep.health()
    assert health["status"] == "ready" and health["workers"]["main/1"]["state"] == "parked"


@pytest.mark.parametrize(
    "operator, replicas, key, status",
    [
        ("main", 3, "admin", 400),  # over max_replicas
        ("main", 0, "admin", 400),  # a pool keeps one
        ("nowhere", 1, "admin", 404),
        ("main", 2, None, 401),
    ],
)
def test_pool_changes_outside_the_bounds_are_refused(dep, operator, replicas, key, status):
    code, out = _scale(dep, operator, replicas, key)
    assert code == status, out
    assert dep.health()["pools"]["main"]["serving"] == 1


def _process_of(dep, instance: str, timeout_s: float = 30.0) -> int:
    """The pid of `instance`'s worker process (before it is ready: by its command line)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                argv = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"pddflow.runtime.workers" in argv and instance.encode() in argv:
                if str(dep.run_dir).encode() in b" ".join(argv):
                    return int(p.name)
        time.sleep(0.05)
    raise AssertionError(f"no process of {instance}")


def test_a_new_instance_that_fails_to_start_is_reported_and_parked(dep, reference):
    """Killed while it starts: the scale answers 503 with its exit, the pool keeps serving on one
    and nothing is restarted behind its back (the next test's scale-up starts it cleanly)."""
    import os
    import signal

    answer: list[tuple[int, dict]] = []
    scaling = threading.Thread(target=lambda: answer.append(_scale(dep, "main", 2)))
    scaling.start()
    os.kill(_process_of(dep, "main/1"), signal.SIGKILL)
    scaling.join()
    ((code, out),) = answer
    assert code == 503 and "main/1 did not start" in out["error"]["message"], out
    time.sleep(2)  # past the supervisor's 1 s backoff: no restart of a parked instance
    assert dep.health()["pools"]["main"]["instances"] == {"main/0": "up", "main/1": "parked"}
    assert _complete(dep, PROMPTS[0], "p_md", 60) == reference[PROMPTS[0]]


def test_an_instance_lost_while_draining_loses_no_request(dep):
    """main/1 holds a streaming request and is drained; killed mid-drain, the request goes on
    elsewhere from its tokens so far and ends as the reference; the scale-down completes."""
    import os
    import signal

    want = GreedyReference(engine="modeled")(PROMPTS[1], LONG)
    code, out = _scale(dep, "main", 2)
    assert code == 200, out
    results: list[list[int]] = []
    streaming = threading.Thread(
        target=lambda: results.append(_complete(dep, PROMPTS[1], "p_rld_md", LONG))
    )
    streaming.start()
    deadline = time.monotonic() + 30
    while dep.health()["workers"]["main/1"].get("legs", 0) < 1:
        assert time.monotonic() < deadline, dep.health()
        time.sleep(0.02)
    answer: list[tuple[int, dict]] = []
    scaling = threading.Thread(target=lambda: answer.append(_scale(dep, "main", 1)))
    scaling.start()
    while dep.health()["workers"]["main/1"]["state"] != "draining":
        assert time.monotonic() < deadline, dep.health()
        time.sleep(0.02)
    os.kill(dep.worker_pid("main/1"), signal.SIGKILL)
    scaling.join()
    streaming.join()
    ((code, out),) = answer
    assert code == 200 and out["instances"]["main/1"] == "parked", out
    assert results == [want]
    time.sleep(2)  # no restart of what was scaled away
    assert dep.health()["workers"]["main/1"]["state"] == "parked"
