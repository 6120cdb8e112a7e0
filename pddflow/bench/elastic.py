"""`pddflow bench elastic`: one load ramp (low -> peak -> low) of the shipped trace's sessions
served three ways in one run: every pool fixed at its fewest replicas, fixed at its most, and
sized live by the planner (docs/benchmarks.md, Elastic pools). Per run: SLA attainment,
device-seconds (each instance's rank processes x the seconds it was up, from /health each
second), errors, each pool's replica timeline and its direction changes; every request's tokens
are checked against the colocated engine's greedy reference."""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from pddflow.bench.deploy_process import DeployProcess
from pddflow.bench.serve import _turn
from pddflow.core.serve_sessions import WorkloadSpec
from pddflow.planner.policy import direction_changes

MODES = ("fixed_min", "fixed_max", "planner")
UP_STATES = ("up", "starting", "draining", "lost")  # an instance holding its devices


def ramp_starts(low_rps: float, peak_rps: float, phase_s: float) -> list[float]:
    """Session start times: `low_rps` for a phase, `peak_rps` for one, `low_rps` for two (the
    load's fall, long enough for pools to shrink after it)."""
    out, t0 = [], 0.0
    for rate in (low_rps, peak_rps, low_rps, low_rps):
        n = max(1, round(rate * phase_s))
        out += [t0 + i / rate for i in range(n)]
        t0 += phase_s
    return out


def elastic_graph(
    graph: Path,
    mode: str,
    most: int | None,
    autoscale: dict,
    out_dir: Path,
    sla: dict | None = None,
) -> Path:
    """`graph` as `mode` runs it: every pool at 1 (fixed_min, planner) or at its most (fixed_max)
    replicas, wired for its most (`most`, or None: each operator's declared replicas), the
    planner on (planner) with `autoscale` over the graph's own, and `sla` (ttft_s, tpot_ms) over
    the graph's scheduler.sla."""
    doc = yaml.safe_load(graph.read_text())
    if sla:
        sched = doc.setdefault("scheduler", {})
        sched["sla"] = {**sched.get("sla", {}), **sla}
    ops = doc["operators"]
    bound = {op: int(most or ops[op].get("replicas", 1)) for op in ops}
    local = doc.setdefault("local", {})
    local["replicas"] = bound if mode == "fixed_max" else dict.fromkeys(ops, 1)
    local["max_replicas"] = bound
    doc["autoscale"] = {**doc.get("autoscale", {}), **autoscale, "enabled": mode == "planner"}
    weights = str(doc.get("model", {}).get("weights", ""))
    if weights and not weights.startswith("builtin:") and (graph.parent / weights).exists():
        doc["model"]["weights"] = str((graph.parent / weights).resolve())
    path = out_dir / f"{graph.stem}-{mode}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@dataclass
class Answer:
    session: int
    turn: int
    prompt: list[int]
    output: list[int]
    max_tokens: int
    ttft_s: float
    tpot_s: float | None


@dataclass
class ModeRun:
    mode: str
    answers: list[Answer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)  # t, pool -> up
    device_seconds: float = 0.0
    wall_s: float = 0.0
    planner: dict | None = None


class _Pools(threading.Thread):
    """Each second: how many instances of each pool hold their devices, and their ranks."""

    def __init__(self, base: str, ranks: dict[str, int], run: ModeRun):
        super().__init__(daemon=True)
        self.base, self.ranks, self.run_ = base, ranks, run
        self.stop_ = threading.Event()

    def run(self) -> None:
        t0 = last = time.monotonic()
        with httpx.Client(timeout=5) as client:
            while not self.stop_.wait(1.0):
                try:
                    h = client.get(f"{self.base}/health").json()
                    up = {
                        op: sum(1 for st in p["instances"].values() if st in UP_STATES)
                        for op, p in h["pools"].items()
                    }
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    continue  # a second without a reading: the next one covers it
                now = time.monotonic()
                self.run_.device_seconds += (now - last) * sum(
                    n * self.ranks[op] for op, n in up.items()
                )
                last = now
                self.run_.samples.append((round(now - t0, 1), up))
                self.run_.planner = h.get("planner")


def run_mode(
    mode: str,
    graph: Path,
    ranks: dict[str, int],
    workload: WorkloadSpec,
    starts: list[float],
    think_s: float,
    timeout_s: float,
    tick: Callable[[], None],
    extra: tuple[str, ...] = (),
) -> ModeRun:
    run = ModeRun(mode)
    with tempfile.TemporaryDirectory(prefix="pddflow-elastic-") as rd:
        dep = DeployProcess(graph, Path(rd), *extra)
        watch = _Pools(dep.base, ranks, run)
        try:
            model = httpx.get(f"{dep.base}/v1/models", timeout=10).json()["data"][0]["id"]
            watch.start()
            t0 = time.perf_counter()
            asyncio.run(_sessions(dep.base, model, workload, starts, think_s, timeout_s, run, tick))
            run.wall_s = time.perf_counter() - t0
            time.sleep(2.0)  # the last second's pool state
        finally:
            watch.stop_.set()
            watch.join(timeout=10)
            dep.stop()
    return run


async def _sessions(base, model, workload, starts, think_s, timeout_s, run, tick) -> None:
    async def one(i: int, spec, at: float) -> None:
        await asyncio.sleep(at)
        context = list(spec.first_prompt)
        for turn, max_tokens in enumerate(spec.output_tokens):
            if turn:
                await asyncio.sleep(think_s)
                context += spec.user_turns[turn - 1]
            try:
                s, out = await _turn(client, base, model, context, max_tokens, timeout_s)
            except Exception as exc:  # noqa: BLE001 - a failed request is counted
                run.errors.append(f"session {i} turn {turn}: {exc}")
                tick()
                return
            run.answers.append(Answer(i, turn, list(context), out, max_tokens, s.ttft_s, s.tpot_s))
            context += out
            tick()

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None)) as client:
        await asyncio.gather(
            *(one(i, s, t) for i, (s, t) in enumerate(zip(workload.sessions, starts, strict=False)))
        )


def reference_mismatches(
    weights: str, runs: list[ModeRun], batch: int = 32, engine: str = "real"
) -> dict[str, int]:
    """Per run: answers whose tokens are not the colocated engine's greedy tokens for the same
    prompt. Each distinct prompt is generated once, to the longest any answer asked for, in
    batches; an answer matches when it is that reference cut where it stopped (its max_tokens,
    or the reference's own end)."""
    from pddflow.bench.serve_reference import reference_engine
    from pddflow.core.payloads import SamplingParams

    eng = reference_engine(weights, engine)
    stops = tuple(eng.tokenizer.eos_token_ids)
    longest: dict[tuple[int, ...], int] = {}
    for r in runs:
        for a in r.answers:
            key = tuple(a.prompt)
            longest[key] = max(longest.get(key, 0), a.max_tokens)
    ref: dict[tuple[int, ...], list[int]] = {}
    for n in sorted(set(longest.values())):
        prompts = [p for p, m in longest.items() if m == n]
        for i in range(0, len(prompts), batch):
            chunk = prompts[i : i + batch]
            params = SamplingParams(n, stop_token_ids=stops)
            got = eng.generate([list(p) for p in chunk], params, max_batch=batch)
            ref.update({p: g.output_ids for p, g in zip(chunk, got, strict=True)})

    def matches(a: Answer) -> bool:
        want = ref[tuple(a.prompt)]
        return a.output == want[: len(a.output)] and len(a.output) >= min(len(want), a.max_tokens)

    return {r.mode: sum(1 for a in r.answers if not matches(a)) for r in runs}


def summarize(run: ModeRun, ttft_s: float, tpot_s: float, mismatches: int) -> dict:
    ok = sum(1 for a in run.answers if a.ttft_s <= ttft_s and (a.tpot_s or 0.0) <= tpot_s)
    total = len(run.answers) + len(run.errors)
    pools = sorted({op for _, up in run.samples for op in up})
    timeline = {op: _changes([(t, up.get(op, 0)) for t, up in run.samples]) for op in pools}
    ttfts = sorted(a.ttft_s for a in run.answers)
    tpots = sorted(a.tpot_s for a in run.answers if a.tpot_s is not None)
    return {
        "mode": run.mode,
        "requests": total,
        "sla_attainment": round(ok / total, 4) if total else None,
        "device_seconds": round(run.device_seconds, 1),
        "errors": len(run.errors),
        "first_errors": run.errors[:3],
        "token_mismatches": mismatches,
        "wall_s": round(run.wall_s, 1),
        "ttft_p50_s": round(ttfts[len(ttfts) // 2], 4) if ttfts else None,
        "ttft_p90_s": round(ttfts[int(len(ttfts) * 0.9)], 4) if ttfts else None,
        "tpot_p50_ms": round(tpots[len(tpots) // 2] * 1e3, 2) if tpots else None,
        "tpot_p90_ms": round(tpots[int(len(tpots) * 0.9)] * 1e3, 2) if tpots else None,
        "replicas": timeline,
        "direction_changes": {
            op: direction_changes([n for _, n in tl]) for op, tl in timeline.items()
        },
        "planner_changes": (run.planner or {}).get("changes"),
    }


def _changes(points: list[tuple[float, int]]) -> list[list]:
    """A pool's count over the run, where it changed."""
    out: list[list] = []
    for t, n in points:
        if not out or out[-1][1] != n:
            out.append([t, n])
    return out
