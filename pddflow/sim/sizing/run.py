"""`pddflow size`'s run, for the command to call with its options as one typed object: the
workload source, each graph sized (search.py) and its winner written as a graph file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pddflow.graph.plan import Plan
from pddflow.sim.agentic import AgenticConfig, pdd_conditions
from pddflow.sim.sizing.cache import Cache
from pddflow.sim.sizing.search import Search, Sizing, size, write_graph
from pddflow.sim.sizing.workloads import AgenticSource, TraceSource, trace_source

WORKLOADS = ("pdd", "agentic", "trace")
BLOCK_TOKENS = 512  # the production profile's prompt hashing


class SizingError(ValueError):
    """A workload that cannot be read; the message names the file."""


@dataclass(frozen=True, kw_only=True)
class SizeOptions:
    budget: float | None = None  # $/h: the most SLA goodput within it; or
    target_rps: float | None = None  # the cheapest meeting this rate
    workload: str = "pdd"  # WORKLOADS; a trace given makes it "trace"
    trace: Path | None = None  # None: the shipped conversation trace
    requests: int = 1000  # per replay (trace: its first N)
    hit_rate: float | None = None  # agentic, pdd: the target mean prefix hit (None: theirs)
    start_rps: float | None = None  # the first capacity search's start (None: the source's)
    precision: float = 0.05  # relative, of each capacity search
    seed: int = 0
    jobs: int = 1  # worker processes
    out_dir: Path = Path(".")
    cache_dir: Path | None = None  # None: scores neither read nor written

    def __post_init__(self) -> None:
        if (self.budget is None) == (self.target_rps is None):
            raise SizingError("give one of a budget ($/h) and a target rate (req/s)")
        if self.workload not in WORKLOADS:
            raise SizingError(f"unknown workload {self.workload!r}; use {', '.join(WORKLOADS)}")

    @property
    def kind(self) -> str:
        return "trace" if self.trace is not None else self.workload

    def source(self) -> AgenticSource | TraceSource:
        if self.kind == "trace":
            from pddflow.data import MOONCAKE_TRACE
            from pddflow.sim.trace import TraceError

            try:
                return trace_source(str(self.trace or MOONCAKE_TRACE), limit=self.requests)
            except (TraceError, OSError) as exc:
                raise SizingError(str(exc)) from exc
        extra = {} if self.hit_rate is None else {"hit_rate": self.hit_rate}
        common = {"requests": self.requests, "rps": 4.0, "seed": self.seed, **extra}
        if self.kind == "pdd":
            return AgenticSource(pdd_conditions(block_tokens=BLOCK_TOKENS, **common))
        return AgenticSource(AgenticConfig(block_tokens=BLOCK_TOKENS, **common))

    def limit(self) -> str:
        return f"${self.budget:g}/h" if self.budget is not None else f"{self.target_rps:g} req/s"


def size_graphs(
    files: list[Path],
    plans: list[Plan],
    opts: SizeOptions,
    track: Callable[[str], Callable[[int, int], None] | None] = lambda _: None,
) -> list[Sizing]:
    """Size each graph (plans: theirs, compiled) on the options' workload; each winner's graph
    is written to out_dir/<name>_sized.yaml (`Sizing.written`). `track(name)` gives each
    graph's progress callback (candidates scored)."""
    source = opts.source()
    start = opts.start_rps or source.base_rps
    results = []
    for f, p in zip(files, plans):
        cache = Cache(opts.cache_dir / f"{p.name}.json" if opts.cache_dir is not None else None)
        tick = track(p.name)
        res = size(
            p,
            lambda plan, c=cache, t=tick: Search(
                plan,
                source,
                seed=opts.seed,
                jobs=opts.jobs,
                cache=c,
                progress=t,
                precision=opts.precision,
            ),
            budget=opts.budget,
            target_rps=opts.target_rps,
            start_rps=start,
        )
        if res.best is not None:
            opts.out_dir.mkdir(parents=True, exist_ok=True)
            path = write_graph(
                str(f),
                res.best,
                opts.out_dir / f"{p.name}_sized.yaml",
                f"`pddflow size` winner for {opts.limit()}, workload {opts.kind}, seed "
                f"{opts.seed}: {res.best.slo_goodput_rps:.3g} req/s SLA goodput at "
                f"${res.best.cost_per_hour:g}/h",
            )
            res.written = str(path)
        results.append(res)
    return results
