"""`pddflow bench serve`: one multi-turn workload against each graph's deployment in turn, measured
at the client and from /metrics (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import json
import re
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pddflow.bench import control_plane
from pddflow.bench.deploy_process import DeployProcess
from pddflow.bench.wan_degrade import WanDegrade, after, degrade_at, variant_counts
from pddflow.core.serve_sessions import WorkloadSpec
from pddflow.core.stats import percentile
from pddflow.runtime.frontend.metrics import DECODE_COUNTERS
from pddflow.runtime.workers.loop import STATUS_EVERY_S


@dataclass
class Sample:
    ttft_s: float
    tpot_s: float | None
    tokens: int
    e2e_s: float
    request_id: str = ""
    session: int = 0
    turn: int = 0
    start_s: float = 0.0  # when the client sent it, from the run's start
    prompt_tokens: int = 0
    timeline: dict | None = None  # the frontend's /v1/requests/{id}/timeline, with --per-request
    token_ids: list[int] = field(default_factory=list, repr=False)  # what the client received


@dataclass
class GraphResult:
    graph: str
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    # CPU seconds of the serving path besides the workers (frontend process, this client)
    frontend_cpu_s: float | None = None
    client_cpu_s: float | None = None
    # instance -> its decode steps over the run
    decode: dict[str, dict] = field(default_factory=dict)
    # --wan-degrade: the scenario, when it was applied (s into the run) and what each link became
    degrade: dict | None = None
    variants: dict[str, int] = field(default_factory=dict)  # requests finished, by variant
    control: dict | None = None  # the control plane's costs (bench/control_plane.py)


def _pct(xs: list[float], q: float) -> float:
    return percentile(sorted(xs), q * 100)


async def _turn(
    client: httpx.AsyncClient,
    base: str,
    model: str,
    prompt: list[int],
    max_tokens: int,
    timeout_s: float,
) -> tuple[Sample, list[int]]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "return_token_ids": True,
        "timeout_s": timeout_s,
    }
    t0 = time.perf_counter()
    first = last = None
    ids: list[int] = []
    rid = ""
    async with client.stream(
        "POST", f"{base}/v1/completions", json=body, timeout=timeout_s + 10
    ) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            rid = chunk.get("id", rid)
            got = chunk["choices"][0].get("token_ids", [])
            if got:
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
                ids += got
    if first is None:
        raise RuntimeError("no tokens")
    tpot = (last - first) / (len(ids) - 1) if len(ids) > 1 else None
    return Sample(
        first - t0, tpot, len(ids), time.perf_counter() - t0, rid, prompt_tokens=len(prompt)
    ), ids


async def _session(
    client,
    base,
    model,
    spec,
    start_delay,
    timeout_s,
    res: GraphResult,
    tick,
    think_s: float = 0.0,
    index: int = 0,
    t_run: float = 0.0,
) -> None:
    await asyncio.sleep(start_delay)
    context = list(spec.first_prompt)
    for turn, max_tokens in enumerate(spec.output_tokens):
        if turn:
            await asyncio.sleep(think_s)  # the agent runs its tool call before the next turn
            context += spec.user_turns[turn - 1]
        start = time.perf_counter() - t_run
        try:
            sample, out = await _turn(client, base, model, context, max_tokens, timeout_s)
        except Exception as exc:  # noqa: BLE001 - a failed request is counted, the session goes on
            res.errors.append(str(exc))
            tick()
            return
        sample.session, sample.turn, sample.start_s = index, turn, start
        sample.token_ids = out
        res.samples.append(sample)
        context += out
        tick()


def _scrape(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for name in ("pddflow_wan_bytes_sent_total", "pddflow_wan_bytes_saved_total"):
        out[name] = sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M))
    for name in ("pddflow_kv_tier_hit_blocks_total", "pddflow_kv_tier_load_seconds_total"):
        for tier, v in re.findall(rf'^{name}{{[^}}]*tier="(\w+)"[^}}]*}} (\S+)$', text, re.M):
            key = f"{name}:{tier}"
            out[key] = out.get(key, 0.0) + float(v)
    m = re.search(r"^pddflow_relay_token_share (\S+)$", text, re.M)
    out["relay_token_share"] = float(m.group(1)) if m else 0.0
    return out


def _timelines(base: str, samples: list[Sample]) -> None:
    with httpx.Client(timeout=10) as client:
        for s in samples:
            r = client.get(f"{base}/v1/requests/{s.request_id}/timeline")
            s.timeline = r.json() if r.status_code == 200 else None


def decode_counters(base: str, since: dict[str, dict] | None = None) -> dict[str, dict]:
    """Each decoder's `DECODE_COUNTERS` from /metrics, less `since`; waits two status periods
    first, so the figures include the last steps."""
    time.sleep(2 * STATUS_EVERY_S)
    text = httpx.get(f"{base}/metrics", timeout=10).text
    keys = {name: field.removeprefix("decode_") for field, (name, _) in DECODE_COUNTERS.items()}
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        if family.name in keys:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    inst = sample.labels["instance"]
                    out.setdefault(inst, {})[keys[family.name]] = sample.value
    for inst, d in out.items():
        d0 = (since or {}).get(inst, {})
        out[inst] = {k: round(v - d0.get(k, 0), 4) for k, v in d.items()}
    return {i: d for i, d in out.items() if d.get("steps", 0) > 0}


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_graph(
    graph: Path,
    workload: WorkloadSpec,
    rps: float,
    wan_gbps: float | None,
    timeout_s: float,
    tick: Callable[[], None],
    think_s: float = 1.0,
    extra: tuple[str, ...] = (),
    per_request: bool = False,
    degrade: WanDegrade | None = None,
) -> GraphResult:
    res = GraphResult(str(graph))
    if degrade is not None:
        res.degrade = {**degrade.as_json(), "applied_at_s": None}
    args = list(extra) + (["--wan-gbps", str(wan_gbps)] if wan_gbps else [])
    with tempfile.TemporaryDirectory(prefix="pddflow-bench-") as rd:
        started = time.perf_counter()
        dep = DeployProcess(graph, Path(rd), *args)
        startup_s = time.perf_counter() - started
        try:
            model = httpx.get(f"{dep.base}/v1/models", timeout=10).json()["data"][0]["id"]

            async def main(t0: float) -> None:
                # the degrade waits beside the sessions; a run that ends first cancels it
                slow = (
                    asyncio.create_task(degrade_at(dep, degrade, t0, res.degrade))
                    if degrade is not None and res.degrade is not None
                    else None
                )
                async with httpx.AsyncClient() as client:
                    await asyncio.gather(
                        *(
                            _session(
                                client,
                                dep.base,
                                model,
                                s,
                                i / rps,
                                timeout_s,
                                res,
                                tick,
                                think_s,
                                i,
                                t0,
                            )
                            for i, s in enumerate(workload.sessions)
                        )
                    )
                if slow is not None:
                    slow.cancel()
                    await asyncio.gather(slow, return_exceptions=True)

            parts = control_plane.processes(dep.base, dep.proc.pid)
            cpu0, c0 = control_plane.cpu_s(parts), _own_cpu_s()
            decode0 = decode_counters(dep.base)
            control0 = control_plane.counters(dep.base)
            t0 = time.perf_counter()
            asyncio.run(main(t0))
            res.wall_s = time.perf_counter() - t0
            cpu = control_plane.cpu_delta(cpu0, control_plane.cpu_s(parts))
            res.control = control_plane.row(
                control0,
                control_plane.counters(dep.base),
                res.wall_s,
                startup_s,
                control_plane.memory(dep.base, dep.proc.pid),
                cpu,
                len(res.samples),
                sum(s.tokens for s in res.samples),
            )
            res.client_cpu_s = _own_cpu_s() - c0
            res.frontend_cpu_s = control_plane.frontend_cpu_s(cpu)
            res.decode = decode_counters(dep.base, decode0)
            res.metrics = _scrape(dep.base)
            res.variants = variant_counts(dep.base)
            if per_request:
                _timelines(dep.base, res.samples)
        finally:
            dep.stop()
    return res


def tier_rows(metrics: dict[str, float]) -> dict[str, dict] | None:
    """Per tier below the device: blocks hit there and the seconds their loads took."""
    rows: dict[str, dict] = {}
    for key, v in metrics.items():
        name, _, tier = key.partition(":")
        if tier and tier != "device":
            field_ = "hit_blocks" if name.startswith("pddflow_kv_tier_hit") else "load_s"
            rows.setdefault(tier, {})[field_] = round(v, 4)
    return rows or None


def exactness(samples: list[Sample], reference: dict[tuple[int, int], list[int]]) -> dict:
    """How many served answers equal the colocated reference's (`bench serve --exact`)."""
    wrong = [
        (s.session, s.turn) for s in samples if reference.get((s.session, s.turn)) != s.token_ids
    ]
    return {"checked": len(samples), "mismatched": len(wrong), "first_mismatched": wrong[:5]}


def summarize(
    res: GraphResult,
    sla_ttft_s: float,
    sla_tpot_s: float,
    reference: dict[tuple[int, int], list[int]] | None = None,
) -> dict:
    ttft = [s.ttft_s for s in res.samples]
    tpot = [s.tpot_s for s in res.samples if s.tpot_s is not None]
    ok = sum(1 for s in res.samples if s.ttft_s <= sla_ttft_s and (s.tpot_s or 0) <= sla_tpot_s)
    sent, saved = (
        res.metrics.get("pddflow_wan_bytes_sent_total", 0.0),
        res.metrics.get("pddflow_wan_bytes_saved_total", 0.0),
    )
    return {
        "graph": res.graph,
        "requests": len(res.samples),
        "errors": len(res.errors),
        "wall_s": round(res.wall_s, 3),
        "ttft_s": {
            q: round(_pct(ttft, v), 4) for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
        },
        "tpot_ms": {
            q: round(_pct(tpot, v) * 1e3, 3) for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
        },
        "slo_goodput_rps": round(ok / res.wall_s, 4) if res.wall_s else 0.0,
        "slo_attainment": round(ok / max(len(res.samples), 1), 4),
        "wan_bytes": int(sent),
        "wan_bytes_saved_by_drc": int(saved),
        "wan_share_of_full_kv": round(sent / (sent + saved), 4) if sent + saved else None,
        # the share of prompt KV the finishing decoder's cache held (any tier): the WAN spared it
        "prefix_hit_rate": round(saved / (sent + saved), 4) if sent + saved else None,
        "cache_tiers": tier_rows(res.metrics),
        **({"tokens_exact": exactness(res.samples, reference)} if reference is not None else {}),
        "relay_token_share": round(res.metrics.get("relay_token_share", 0.0), 4),
        "requests_by_variant": res.variants,
        **({"wan_degrade": _degrade_row(res)} if res.degrade is not None else {}),
        "first_errors": res.errors[:3],
        "host_cpu": _host_cpu(res),
        "control_plane": res.control,
        "decode_steps": res.decode or None,
        "ttft_mean_s": round(statistics.fmean(ttft), 4) if ttft else None,
        # every request, to recompute any statistic
        "ttft_samples_s": sorted(round(x, 4) for x in ttft),
        **(
            {
                "per_request": [
                    _request_row(s) for s in sorted(res.samples, key=lambda s: (s.session, s.turn))
                ]
            }
            if any(s.timeline is not None for s in res.samples)
            else {}
        ),
    }


def _degrade_row(res: GraphResult) -> dict:
    """The scenario as applied, and TTFT and the variants of what came after it."""
    d = dict(res.degrade or {})
    at = d.get("applied_at_s")
    if at is None:
        return {**d, "note": d.get("error") or "the run ended before the degrade was due"}
    later = [s.ttft_s for s in res.samples if s.start_s >= at]
    d["requests_after"] = len(later)
    d["ttft_after_s"] = {
        q: round(_pct(later, v), 4) if later else None
        for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
    }
    # by the time they finished: a request in flight at the degrade counts after it
    d["variants_after"] = after(res.variants, d.pop("variants_before", None))
    return d


def _host_cpu(res: GraphResult) -> dict | None:
    """The serving path's CPU besides the workers, in all and per streamed token."""
    if res.frontend_cpu_s is None or res.client_cpu_s is None:
        return None
    tokens = sum(s.tokens for s in res.samples)
    total = res.frontend_cpu_s + res.client_cpu_s
    return {
        "frontend_s": round(res.frontend_cpu_s, 3),
        "client_s": round(res.client_cpu_s, 3),
        "output_tokens": tokens,
        "ms_per_token": round(total / tokens * 1e3, 4) if tokens else None,
    }


def _request_row(s: Sample) -> dict:
    """One request as `--per-request` reports it; `events` are ms from the frontend's arrival."""
    tl = s.timeline or {}
    return {
        "session": s.session,
        "turn": s.turn,
        "request_id": s.request_id,
        "start_s": round(s.start_s, 4),
        "prompt_tokens": s.prompt_tokens,
        "output_tokens": s.tokens,
        "ttft_s": round(s.ttft_s, 4),
        "e2e_s": round(s.e2e_s, 4),
        "variant": tl.get("variant"),
        "handoff": tl.get("handoff"),
        "tokens_by_operator": tl.get("tokens_by_operator"),
        "events": tl.get("events", []),
    }


def ratios(base: dict, other: dict) -> dict:
    def r(a: float | None, b: float | None) -> float | None:
        return round(a / b, 4) if a and b else None

    return {
        "ttft_p50": r(other["ttft_s"]["p50"], base["ttft_s"]["p50"]),
        "ttft_p90": r(other["ttft_s"]["p90"], base["ttft_s"]["p90"]),
        "ttft_p99": r(other["ttft_s"]["p99"], base["ttft_s"]["p99"]),
        "tpot_p50": r(other["tpot_ms"]["p50"], base["tpot_ms"]["p50"]),
        "tpot_p90": r(other["tpot_ms"]["p90"], base["tpot_ms"]["p90"]),
        "slo_goodput": r(other["slo_goodput_rps"], base["slo_goodput_rps"]),
    }
