"""Fault drills against a live deployment, shared by tests/chaos and benchmarks/chaos.py: a burst
of concurrent requests, a fault in the middle of it, then new requests until the deployment
serves again. Every request is classified: exact (the reference tokens), a clean error (an HTTP
error with an OpenAI error body), wrong (tokens that differ: a correctness bug) or hung (no answer
within the client's bound)."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
import urllib.error
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from pddflow.bench.deploy_process import DeployProcess, post_json

Reference = Callable[[str, int], list[int]]
ROUTES = (("p_md", None), ("p_rld_md", "one_shot"), ("p_rld_md", "catch_up"), (None, None))


@dataclass
class DrillResult:
    fault: str
    sent: int = 0
    exact: int = 0
    clean_errors: int = 0
    wrong: int = 0
    hung: int = 0
    # the fault -> a new request sent after it served exactly (probed while the burst runs)
    recover_s: float | None = None
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def ask(dep: DeployProcess, prompt: str, n: int, timeout_s: float, **extra) -> tuple[str, object]:
    """("exact"/"wrong" with the tokens, "error" with the message, or "hung")."""
    body = {"model": "pdd", "prompt": prompt, "max_tokens": n, "temperature": 0}
    try:
        code, out = post_json(
            f"{dep.base}/v1/completions",
            {**body, "return_token_ids": True, **extra},
            timeout=timeout_s,
        )
    except (TimeoutError, urllib.error.URLError) as exc:
        return "hung", str(exc)
    if code == 200:
        return "ok", out["choices"][0]["token_ids"]
    return "error", f"{code}: {out.get('error', {}).get('message', out)}"


def kill(instance: str) -> Callable[[DeployProcess], None]:
    def fault(dep: DeployProcess) -> None:
        os.kill(dep.worker_pid(instance), signal.SIGKILL)

    return fault


def cut_link(link: str, seconds: float, after_bytes: int = 0) -> Callable[[DeployProcess], None]:
    def fault(dep: DeployProcess) -> None:
        code, out = dep.cut_link(link, seconds, after_bytes)
        assert code == 200, out

    return fault


# the single faults the drills inject (tests/chaos/test_drills.py, benchmarks/chaos.py)
FAULTS = {
    "kill -9 prefill": kill("prefill/0"),
    "kill -9 relay": kill("relay/0"),
    "kill -9 main": kill("main/0"),
    "WAN cut for 3 s": cut_link("A-B", 3.0),
    "WAN black hole after 1 MB, 5 s": cut_link("A-B", 5.0, after_bytes=1_000_000),
}


class GreedyReference:
    """The colocated engine's greedy tokens for a prompt: what every drilled request must get.
    Answers are kept; `many` computes several in one batch (the engine's outputs do not depend on
    the batch: docs/engine.md, Batch invariance)."""

    def __init__(self, spec: str = "builtin:tiny-llama", engine: str = "real"):
        from pddflow.bench.serve_reference import reference_engine

        self.engine = reference_engine(spec, engine)
        self._known: dict[tuple[str, int], list[int]] = {}
        self._lock = threading.Lock()  # drills ask from several threads; the engine is not shared

    def __call__(self, prompt: str, n: int) -> list[int]:
        return self.many([prompt], n)[prompt]

    def many(self, prompts: list[str], n: int) -> dict[str, list[int]]:
        from pddflow.core.payloads import SamplingParams

        eng = self.engine
        with self._lock:
            todo = list(dict.fromkeys(p for p in prompts if (p, n) not in self._known))
            if todo:
                stops = tuple(eng.tokenizer.eos_token_ids)
                greedy = SamplingParams(max_tokens=n, stop_token_ids=stops)
                seqs = eng.generate([eng.tokenizer.encode(p) for p in todo], greedy, len(todo))
                for p, seq in zip(todo, seqs, strict=True):
                    self._known[(p, n)] = list(seq.output_ids)
            return {p: self._known[(p, n)] for p in prompts}


@functools.cache
def greedy_reference(spec: str = "builtin:tiny-llama", engine: str = "real") -> GreedyReference:
    """The process's one reference of `spec` on `engine` (a test session builds each once: a
    real engine's build is a second or two of CPU, and its answers are kept)."""
    return GreedyReference(spec, engine)


def greedy_outputs(
    prompts: list[str], max_tokens: int, spec: str = "builtin:tiny-llama"
) -> dict[str, list[int]]:
    """Several prompts' greedy tokens, in one batch."""
    return GreedyReference(spec).many(prompts, max_tokens)


def drill(
    dep: DeployProcess,
    name: str,
    fault: Callable[[DeployProcess], None],
    reference: Reference,
    *,
    burst: int = 6,
    tokens: int = 24,
    fault_after_s: float = 1.0,
    timeout_s: float = 60.0,
    recover_within_s: float = 90.0,
    after: int = 4,
) -> DrillResult:
    res = DrillResult(name)
    tag = f"{name}-{time.monotonic_ns()}"
    prompts = [
        f"{tag} request {k}: " + "words on the wire " * (4 + 5 * (k % 4)) for k in range(burst)
    ]
    many = getattr(reference, "many", None)  # one batch when the reference can
    want = many(prompts, tokens) if many else {p: reference(p, tokens) for p in prompts}
    lock = threading.Lock()

    def one(k: int, prompt: str) -> None:
        variant, handoff = ROUTES[k % len(ROUTES)]
        extra = {key: v for key, v in (("variant", variant), ("handoff", handoff)) if v}
        kind, detail = ask(dep, prompt, tokens, timeout_s, **extra)
        with lock:
            res.sent += 1
            if kind == "ok":
                if detail == want[prompt]:
                    res.exact += 1
                else:
                    res.wrong += 1
                    res.errors.append(f"wrong tokens for {prompt[:40]!r}")
            elif kind == "error":
                res.clean_errors += 1
                res.errors.append(str(detail)[:200])
            else:
                res.hung += 1

    probe = f"{tag} after the fault"

    def recover(at: float) -> None:  # new requests, from the fault on, until one is served
        while time.monotonic() - at < recover_within_s:
            kind, got = ask(dep, probe, 8, timeout_s)
            if kind == "ok" and got == reference(probe, 8):
                res.recover_s = round(time.monotonic() - at, 2)
                return
            time.sleep(0.5)

    with ThreadPoolExecutor(burst + 1) as pool:
        futures = [pool.submit(one, k, p) for k, p in enumerate(prompts)]
        time.sleep(fault_after_s)
        fault(dep)
        futures.append(pool.submit(recover, time.monotonic()))
        for f in futures:
            f.result()
    for k in range(after):
        one(k, prompts[k % len(prompts)])
    return res


def wait_until(what: str, pred: Callable[[], object], timeout_s: float) -> object:
    """`pred()` once it is truthy, polled every 0.2 s; AssertionError naming `what` after
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.2)
