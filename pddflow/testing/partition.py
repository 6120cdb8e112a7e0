"""Partition drills against a live deployment of PDD (frontend, prefill and relay in cluster A, main
across the WAN in B), shared by tests/chaos/test_partitions.py and benchmarks/chaos.py.

Requests are launched so that, when the link is impaired, some are in the WAN KV transfer to main,
some in the relay's handoff to main, some decoding on main, and some arrive during the split
(queued); each one's phase is read back from its timeline. Every request must end with the
reference tokens or a typed error before its deadline. After the link heals, every pool's blocks
return to its cached count, the router's mirrors equal the caches, and main serves again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from pddflow.bench.deploy_process import DeployProcess, get_json, post_json

PHASES = ("wan_kv", "handoff", "main_decode", "queued")
LINK = "A-B"
MAIN = "main/0"


@dataclass
class Fault:
    name: str
    seconds: float
    loss: float = 1.0
    from_cluster: str | None = None  # a one-way split: only what this cluster sends is lost


@dataclass
class PartitionResult:
    fault: str
    sent: int = 0
    exact: int = 0
    typed_errors: int = 0
    wrong: int = 0
    hung: int = 0  # no answer within the request's deadline (and a margin)
    # phase at the split -> outcome (exact, typed_error, wrong, hung) -> requests
    phases: dict[str, dict[str, int]] = field(default_factory=dict)
    slowest_s: float = 0.0  # the longest any request took to end (exact or error)
    deadline_s: float = 0.0
    # from the split to main shown unreachable (routing avoids it); None: its lease held
    around_s: float | None = None
    # a request sent once main was shown unreachable: served exactly without main (None: not
    # sent, the lease held or the split ended first)
    routed_around: bool | None = None
    # from the heal to main serving a request of its own again
    back_s: float | None = None
    blocks_leaked: int = 0  # KV blocks in use beyond the caches' after healing
    mirror_drift: int = 0
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _words(n: int) -> str:
    return "words on the wire " * n


# (seconds before the split, variant, handoff, prompt words, max tokens): launched so that at
# the split each is in its phase on this deployment (a 0.05 Gbps WAN: a 16-word prompt's KV takes
# about 1.5 s to cross); the phase each was really in is read from its timeline
LAUNCHES = (
    (-2.5, "p_md", None, 4, 64),  # decoding on main
    (-2.5, "p_rld_md", "one_shot", 6, 64),  # handed off: decoding on main
    (-1.2, "p_rld_md", "catch_up", 4, 64),  # in the handoff (main catches up)
    (-0.5, "p_md", None, 16, 24),  # its KV crossing the WAN
    (-0.5, "p_rld_md", "one_shot", 16, 24),  # its KV crossing the WAN (the relay decodes)
    (0.3, "p_md", None, 6, 24),  # arrives during the split
    (0.3, None, None, 8, 24),  # arrives during the split, the scheduler's choice
)


def phase_at(timeline: dict, split_ms: float) -> str:
    """Where the request was when the link was impaired, `split_ms` after its arrival."""
    if split_ms < 0:
        return "queued"
    before = [e for e in timeline.get("events", []) if e["t_ms"] <= split_ms]
    names = {e["event"] for e in before}
    main_has_kv = any(e["event"] == "kv_landed" and e.get("instance") == MAIN for e in before)
    if timeline.get("variant") == "p_md":
        return "main_decode" if main_has_kv else "wan_kv"
    if "handoff_sent" in names:
        return "main_decode"
    if "handoff_start" in names or main_has_kv:
        return "handoff"
    return "wan_kv"


def assert_settled(res: PartitionResult) -> None:
    """What every drill must end with, whatever the fault: no request wrong or past its deadline,
    main serving again after the heal, no block leaked, the mirror equal to the caches."""
    detail = f"{res.to_dict()}"
    assert res.wrong == 0 and res.hung == 0, detail
    assert res.exact + res.typed_errors == res.sent, detail
    assert res.slowest_s <= res.deadline_s, detail  # no client waits past its deadline
    assert res.back_s is not None, detail  # main serves again after the heal
    assert res.blocks_leaked == 0 and res.mirror_drift == 0, detail


def admin_split(dep: DeployProcess) -> Callable[[Fault], None]:
    """A fault through the deployment's admin endpoint (the local backend's link relays)."""

    def split(fault: Fault) -> None:
        code, out = dep.partition_link(LINK, fault.seconds, fault.loss, fault.from_cluster)
        assert code == 200, out

    return split


def partition_drill(
    dep: DeployProcess,
    fault: Fault,
    reference: Callable[[str, int], list[int]],
    *,
    deadline_s: float = 45.0,
    heal_within_s: float = 60.0,
    split: Callable[[Fault], None] | None = None,
) -> PartitionResult:
    """`split(fault)` starts the fault and returns (default: `admin_split`); it lasts
    fault.seconds."""
    res = PartitionResult(fault.name, deadline_s=deadline_s)
    tag = f"{fault.name}-{time.monotonic_ns()}"
    plan = [
        (at, v, h, f"{tag} {k}: " + _words(w), n) for k, (at, v, h, w, n) in enumerate(LAUNCHES)
    ]
    many = getattr(reference, "many", None)
    want = {}
    for n in {p[4] for p in plan}:
        prompts = [p[3] for p in plan if p[4] == n]
        want.update(many(prompts, n) if many else {p: reference(p, n) for p in prompts})
    lock = threading.Lock()
    # the split happens at start; launches are relative to it
    start = time.monotonic() - min(at for at, *_ in LAUNCHES)
    split_at = start
    probe = f"{tag} around the split: " + _words(5)
    want[probe] = reference(probe, 8)

    def around() -> None:  # the scheduler's choice while main is unreachable
        body = {"model": "pdd", "prompt": probe, "max_tokens": 8, "temperature": 0}
        body.update(return_token_ids=True, timeout_s=deadline_s)
        code, out = post_json(f"{dep.base}/v1/completions", body, timeout=deadline_s + 10)
        if code != 200:
            res.routed_around = False
            res.errors.append(f"around the split: {code}: {out}")
            return
        _, tl = get_json(f"{dep.base}/v1/requests/{out['id']}/timeline")
        exact = out["choices"][0]["token_ids"] == want[probe]
        res.routed_around = exact and "main" not in tl["tokens_by_operator"]

    watch = _Watch(dep, around)

    def one(at: float, variant, handoff, prompt: str, n: int) -> None:
        time.sleep(max(0.0, start + at - time.monotonic()))
        sent = time.monotonic()
        body = {"model": "pdd", "prompt": prompt, "max_tokens": n, "temperature": 0}
        body.update(return_token_ids=True, timeout_s=deadline_s)
        body.update({k: v for k, v in (("variant", variant), ("handoff", handoff)) if v})
        try:
            code, out = post_json(f"{dep.base}/v1/completions", body, timeout=deadline_s + 10)
        except (TimeoutError, OSError) as exc:
            with lock:
                res.sent += 1
                res.hung += 1
                res.errors.append(f"no answer: {exc}")
                _count(res, "?", "hung")
            return
        took = time.monotonic() - sent
        phase = "queued" if sent >= start else "?"
        if code == 200 and phase != "queued":
            _, tl = get_json(f"{dep.base}/v1/requests/{out['id']}/timeline")
            phase = phase_at(tl, (split_at - sent) * 1e3)
        with lock:
            res.sent += 1
            res.slowest_s = max(res.slowest_s, round(took, 2))
            if took > deadline_s + 2:
                outcome = "hung"
                res.errors.append(f"{phase}: answered after {took:.1f} s, past its deadline")
            elif code == 200:
                outcome = "exact" if out["choices"][0]["token_ids"] == want[prompt] else "wrong"
                if outcome == "wrong":
                    res.errors.append(f"{phase}: wrong tokens for {prompt[:40]!r}")
            elif out.get("error", {}).get("type"):
                outcome = "typed_errors"
                res.errors.append(f"{phase}: {code}: {out['error']['message'][:160]}")
            else:
                outcome = "wrong"
                res.errors.append(f"{phase}: {code} without an OpenAI error body")
            setattr(res, outcome, getattr(res, outcome) + 1)
            _count(res, phase, outcome)

    with ThreadPoolExecutor(len(plan)) as pool:
        futures = [pool.submit(one, *p) for p in plan]
        time.sleep(max(0.0, start - time.monotonic()))
        (split or admin_split(dep))(fault)
        split_at = time.monotonic()
        watch.start(split_at)
        for f in futures:
            f.result()
    healed_at = split_at + fault.seconds
    res.around_s = watch.stop()
    res.back_s = _main_serves_again(dep, tag, reference, healed_at, heal_within_s)
    res.blocks_leaked, res.mirror_drift = _settled(dep, heal_within_s)
    return res


class _Watch:
    """Polls /health from the split until main is shown unreachable (or the drill ends)."""

    def __init__(self, dep: DeployProcess, then: Callable[[], None]):
        self.dep, self.then, self.seen_s = dep, then, None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, split_at: float) -> None:
        self._thread = threading.Thread(target=self._poll, args=(split_at,), daemon=True)
        self._thread.start()

    def _poll(self, split_at: float) -> None:
        while not self._stop.wait(0.2):
            state = self.dep.health()["workers"][MAIN]["state"]
            if state in ("unreachable", "lost"):
                self.seen_s = round(time.monotonic() - split_at, 2)
                self.then()
                return

    def stop(self) -> float | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        return self.seen_s


def _main_serves_again(
    dep: DeployProcess, tag: str, reference, healed_at: float, within_s: float
) -> float | None:
    """Seconds from the heal to a p_md request served by main with the reference tokens."""
    probe = f"{tag} after the heal: " + _words(3)
    want = reference(probe, 8)
    time.sleep(max(0.0, healed_at - time.monotonic()))
    while time.monotonic() - healed_at < within_s:
        if dep.health()["workers"][MAIN]["state"] == "up":
            body = {"model": "pdd", "prompt": probe, "max_tokens": 8, "temperature": 0}
            body.update(return_token_ids=True, variant="p_md", timeout_s=20)
            code, out = post_json(f"{dep.base}/v1/completions", body, timeout=30)
            if code == 200 and out["choices"][0]["token_ids"] == want:
                return round(time.monotonic() - healed_at, 2)
        time.sleep(0.2)
    return None


def _settled(dep: DeployProcess, within_s: float) -> tuple[int, int]:
    """(blocks in use beyond the caches, mirror drifts) once nothing runs, or at `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        h = dep.health()
        up = {i: w for i, w in h["workers"].items() if w["state"] == "up"}
        leaked = sum(w["kv_blocks_used"] - w["cached_blocks"] for w in up.values())
        idle = all(w["legs"] == 0 for w in up.values()) and h["live_requests"] == 0
        if (idle and leaked == 0) or time.monotonic() > deadline:
            return leaked, len(h["mirror_drift"])
        time.sleep(0.3)


def results_table(results: list[PartitionResult]) -> str:
    """One markdown row per drill (benchmarks/chaos.py, benchmarks/ray_partition.py)."""

    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f} s"

    lines = [
        "| fault | sent | exact | typed errors | wrong | hung | slowest | around main | back "
        "| routed around | blocks leaked | mirror drift |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        around = "-" if r.routed_around is None else ("yes" if r.routed_around else "NO")
        cells = (r.fault, r.sent, r.exact, r.typed_errors, r.wrong, r.hung, secs(r.slowest_s))
        cells += (secs(r.around_s), secs(r.back_s), around, r.blocks_leaked, r.mirror_drift)
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def _count(res: PartitionResult, phase: str, outcome: str) -> None:
    by = res.phases.setdefault(phase, {})
    by[outcome] = by.get(outcome, 0) + 1
