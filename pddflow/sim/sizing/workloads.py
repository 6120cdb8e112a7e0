"""Workload sources for `pddflow size`: the same workload at any offered rate, and a key that
names it in the score cache."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pddflow.sim.agentic import AgenticConfig, generate
from pddflow.sim.workload import Workload


@dataclass(frozen=True)
class AgenticSource:
    """The agentic generator; the rate is its `rps`."""

    config: AgenticConfig

    @property
    def base_rps(self) -> float:
        return self.config.rps

    def at(self, rps: float) -> Workload:
        return generate(replace(self.config, rps=rps))

    def key(self) -> dict:
        return {"agentic": asdict(self.config)}


@dataclass(frozen=True)
class TraceSource:
    """A Mooncake trace, its arrivals compressed or stretched to the rate."""

    path: str
    limit: int | None = None
    input_scale: float = 1.0
    output_scale: float = 1.0
    base_rps: float = 1.0  # the trace's own mean rate (set by `trace_source`)

    def at(self, rps: float) -> Workload:
        from pddflow.sim.trace import load_trace

        return load_trace(
            self.path,
            rate_scale=rps / self.base_rps,
            input_scale=self.input_scale,
            output_scale=self.output_scale,
            limit=self.limit,
        )

    def key(self) -> dict:
        digest = hashlib.sha256(Path(self.path).read_bytes()).hexdigest()[:16]
        return {"trace": digest, **{k: v for k, v in asdict(self).items() if k != "path"}}


def trace_source(path: str, limit: int | None = None, **scales: float) -> TraceSource:
    src = TraceSource(str(path), limit, **scales)
    wl = src.at(1.0)
    rate = (len(wl.requests) - 1) / wl.duration_s if wl.duration_s > 0 else 1.0
    return replace(src, base_rps=rate)
