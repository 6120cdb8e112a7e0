"""What the control plane costs in one `bench serve` run, the figures that grow with the instance
count (docs/simulator.md, Fleet scale): the time to start, each process's memory, the frontend's
CPU per request and per streamed token, the workers' reports per second and the time to route a
request."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from pddflow.bench.deploy_process import metric_samples


def counters(base: str) -> dict[str, float]:
    """Reports received by kind, and the routing histogram's count and sum, as /metrics has them."""
    out: dict[str, float] = {}
    for s in metric_samples(base):
        if s.name == "pddflow_reports_total":
            out[f"reports:{s.labels['kind']}"] = s.value
        elif s.name in ("pddflow_route_seconds_count", "pddflow_route_seconds_sum"):
            out[s.name] = s.value
        elif s.name == "pddflow_route_seconds_bucket":
            out[f"route_le:{s.labels['le']}"] = s.value
    return out


def memory(base: str, frontend_pid: int) -> dict:
    """Resident memory of every worker process (/health's pids; this host's) and the frontend."""
    workers = httpx.get(f"{base}/health", timeout=10).json()["workers"]
    rss = [r for w in workers.values() for p in _pids(w) if (r := _rss_mib(p)) is not None]
    return {
        "instances": len(workers),
        "worker_rss_mib": {
            "mean": round(sum(rss) / len(rss), 1) if rss else None,
            "max": round(max(rss), 1) if rss else None,
            "total": round(sum(rss), 1),
        },
        "frontend_rss_mib": _rss_mib(frontend_pid),
    }


def processes(base: str, deployer: int) -> dict[str, list[int]]:
    """The deployment's processes on this host by part: the deploying process (the router, and the
    API when there is one), its API processes (deploy --api-servers), the workers' ranks and the
    local backend's emulated links (their relays' process: not the frontend's work)."""
    try:
        health = httpx.get(f"{base}/health", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return {"router": [deployer]}
    return {
        "router": [deployer],
        "api": [a["pid"] for a in health.get("api_servers", []) if a.get("pid")],
        "workers": [p for w in health.get("workers", {}).values() for p in _pids(w)],
        "links": [lp["pid"]] if (lp := health.get("link_process")) else [],
    }


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of one process (its threads, not its children); None off Linux."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_s(parts: dict[str, list[int]]) -> dict[str, float | None]:
    """CPU seconds of each part so far; None for a part with a process that cannot be read."""
    out: dict[str, float | None] = {}
    for part, pids in parts.items():
        got = [process_cpu_s(p) for p in pids]
        out[part] = None if any(c is None for c in got) else sum(got)  # type: ignore[misc]
    return out


def cpu_delta(before: dict[str, float | None], after: dict[str, float | None]) -> dict:
    """Each part's CPU seconds between two `cpu_s` readings (a worker restarted meanwhile: None)."""
    return {
        k: (round(after[k] - v, 3) if v is not None and after.get(k) is not None else None)  # type: ignore[operator]
        for k, v in before.items()
    }


def frontend_cpu_s(cpu: dict[str, float | None]) -> float | None:
    """The frontend's share of a `cpu_delta`: the deploying process and its API processes."""
    router, api = cpu.get("router"), cpu.get("api", 0.0)
    return router + api if router is not None and api is not None else None


def row(
    before: dict[str, float],
    after: dict[str, float],
    wall_s: float,
    startup_s: float,
    mem: dict,
    cpu: dict[str, float | None],
    requests: int,
    tokens: int,
) -> dict:
    """The run's control-plane figures: `before` and `after` bracket the workload; `cpu` is each
    part's CPU seconds meanwhile (`cpu_delta`)."""
    frontend_s = frontend_cpu_s(cpu)
    kinds = sorted({k.split(":", 1)[1] for k in after if k.startswith("reports:")})
    per_s = {
        k: round((after.get(f"reports:{k}", 0) - before.get(f"reports:{k}", 0)) / wall_s, 1)
        for k in kinds
    }
    n = after.get("pddflow_route_seconds_count", 0) - before.get("pddflow_route_seconds_count", 0)
    total = after.get("pddflow_route_seconds_sum", 0) - before.get("pddflow_route_seconds_sum", 0)
    return {
        "startup_s": round(startup_s, 2),
        **mem,
        "frontend_cpu_ms_per_request": (
            round(frontend_s / requests * 1e3, 2) if frontend_s and requests else None
        ),
        # the issue-42 figures: what one deployment streams, and the frontend's CPU for each token
        "streamed_tokens_per_s": round(tokens / wall_s, 1) if wall_s else None,
        "frontend_cpu_us_per_token": (
            round(frontend_s / tokens * 1e6, 1) if frontend_s and tokens else None
        ),
        # per part: with API processes the router's share is decisions only; the workers' share
        # is what the machine's cores give to the fleet itself (modeled workers still move KV)
        "cpu_us_per_token": {
            k: round(v / tokens * 1e6, 1) if v is not None and tokens else None
            for k, v in cpu.items()
        },
        "reports_per_s": {"all": round(sum(per_s.values()), 1), **per_s},
        "route_ms": {
            "mean": round(total / n * 1e3, 4) if n else None,
            "p99_at_most": _bucket_quantile(before, after, 0.99),
        },
    }


def _bucket_quantile(before: dict[str, float], after: dict[str, float], q: float) -> float | None:
    """The smallest bucket bound (ms) holding `q` of the run's routing times."""
    bounds = sorted(
        (float(k.split(":", 1)[1]), v - before.get(k, 0))
        for k, v in after.items()
        if k.startswith("route_le:")
    )
    if not bounds or bounds[-1][1] <= 0:
        return None
    for le, count in bounds:
        if count >= q * bounds[-1][1]:
            return le * 1e3 if le != float("inf") else None
    return None


def _pids(worker: dict) -> list[int]:
    return [r["pid"] for r in worker.get("ranks", []) if r.get("pid")] or (
        [worker["pid"]] if worker.get("pid") else []
    )


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None
