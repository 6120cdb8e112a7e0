"""`bench serve --wan-degrade AT_S:GBPS[:JITTER_P99_MS]`: the scenario, and its application to a
running deployment through the admin endpoint (`/admin/links/NAME/degrade`), AT_S seconds into the
graph's run, on every link of the graph."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any

import httpx

from pddflow.bench.deploy_process import DeployProcess, metric_samples

FLAG = "--wan-degrade"
FORM = f"{FLAG} AT_S:GBPS[:JITTER_P99_MS], e.g. {FLAG} 20:0.01 or {FLAG} 20:0.01:500"


@dataclass(frozen=True)
class WanDegrade:
    at_s: float  # seconds into the run (from the first session's start)
    gbps: float
    jitter_p99_ms: float | None = None  # None: the declared jitter

    @staticmethod
    def parse(text: str) -> WanDegrade:
        """ValueError naming the flag, what is wrong and the form it takes."""
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"{FLAG} {text!r}: expected 2 or 3 numbers; use {FORM}")
        names = ("AT_S", "GBPS", "JITTER_P99_MS")
        values = []
        for name, part in zip(names, parts, strict=False):
            try:
                v = float(part)
            except ValueError:
                raise ValueError(
                    f"{FLAG} {text!r}: {name} {part!r} is not a number; use {FORM}"
                ) from None
            if not math.isfinite(v):
                raise ValueError(f"{FLAG} {text!r}: {name} must be finite; use {FORM}")
            values.append(v)
        at_s, gbps = values[0], values[1]
        jitter = values[2] if len(values) == 3 else None
        if at_s < 0:
            raise ValueError(f"{FLAG} {text!r}: AT_S must be >= 0 seconds; use {FORM}")
        if gbps <= 0:
            raise ValueError(f"{FLAG} {text!r}: GBPS must be > 0; use {FORM}")
        if jitter is not None and jitter < 0:
            raise ValueError(f"{FLAG} {text!r}: JITTER_P99_MS must be >= 0; use {FORM}")
        return WanDegrade(at_s, gbps, jitter)

    def as_json(self) -> dict[str, Any]:
        return {"at_s": self.at_s, "gbps": self.gbps, "jitter_p99_ms": self.jitter_p99_ms}

    def describe(self) -> str:
        jitter = "" if self.jitter_p99_ms is None else f", jitter P99 {self.jitter_p99_ms:g} ms"
        return f"degraded to {self.gbps:g} Gbps{jitter} at {self.at_s:g} s"


async def degrade_at(
    dep: DeployProcess, scenario: WanDegrade, t0: float, record: dict[str, Any]
) -> None:
    """At t0 + at_s (perf_counter), degrade every link of the deployment; `record` gets when it
    was applied (s from t0) and each link's answer, or the error. Cancelled when the run ended
    first (then `applied_at_s` stays None)."""
    await asyncio.sleep(max(0.0, t0 + scenario.at_s - time.perf_counter()))
    try:
        links = await asyncio.to_thread(lambda: list(dep.health().get("links", {})))
        record["variants_before"] = await asyncio.to_thread(variant_counts, dep.base)
        answers: dict[str, Any] = {}
        for link in links:
            code, out = await asyncio.to_thread(
                dep.degrade_link, link, scenario.gbps, scenario.jitter_p99_ms
            )
            if code != 200:
                error = out.get("error", {}).get("message", out)
                record["error"] = f"{link}: HTTP {code}: {error}"
                return
            answers[link] = out["emulated"]
    except (
        OSError,
        httpx.HTTPError,
    ) as exc:  # the deployment did not answer: the run goes on undegraded
        record["error"] = f"{type(exc).__name__}: {exc}"
        return
    record["applied_at_s"] = round(time.perf_counter() - t0, 3)
    record["links"] = answers


def variant_counts(base: str) -> dict[str, int]:
    """Requests finished so far by variant, from /metrics (pddflow_requests_total)."""
    out: dict[str, int] = {}
    for s in metric_samples(base):
        if s.name == "pddflow_requests_total":
            v = s.labels["variant"]
            out[v] = out.get(v, 0) + int(s.value)
    return out


def after(total: dict[str, int], before: dict[str, int] | None) -> dict[str, int]:
    return {v: n - (before or {}).get(v, 0) for v, n in sorted(total.items())}
