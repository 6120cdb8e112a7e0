"""The search of `pddflow size`: which candidates to score and which wins.

The search assumes more replicas, or a larger host tier, never lower the score of a candidate (a
replica added is capacity added; more host memory only turns misses into hits). Budget mode
therefore only evaluates *maximal* candidates (no operator can take one more replica within the
budget and the devices, at the candidate's host-tier rung): all of them when they are few
(`exhaustive_max`), else a pattern search on them (a coarse grid of each operator's range, then
the best point's neighbours at halving steps). Target mode walks candidates cheapest first,
skipping any that a failed candidate dominates, and stops at the first that meets the target.

Evaluations run in a local process pool, are cached by (graph, replicas, workload, seed, mode,
search settings, and a digest of the simulator's code) in a JSON file (cache.py), and depend only
on those: the search is deterministic for a seed.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pddflow.graph.plan import Plan
from pddflow.sim.sizing.cache import CACHE_VERSION, Cache, code_digest, plan_digest
from pddflow.sim.sizing.scores import Score, evaluate
from pddflow.sim.sizing.space import Replicas, Space, shape_combos, shapes_of, with_shapes

HINTED_FACTOR = 1.5  # bracketing step of a capacity search that starts at a probe's capacity


@dataclass
class Sizing:
    graph: str
    mode: str  # budget | target
    limit: float  # the budget ($/h) or the target rate (req/s)
    best: Score | None
    evaluated: list[Score] = field(default_factory=list)
    cache_hits: int = 0
    sims: int = 0
    written: str | None = None  # the winner's graph file, once written

    def frontier(self) -> list[Score]:
        """The evaluated candidates no cheaper one beats on goodput (goodput vs $/h)."""
        out, top = [], -1.0
        for s in sorted(self.evaluated, key=lambda s: (s.cost_per_hour, -s.slo_goodput_rps)):
            if s.slo_goodput_rps > top:
                out.append(s)
                top = s.slo_goodput_rps
        return out

    def to_dict(self) -> dict:
        return {
            "graph": self.graph,
            "mode": self.mode,
            "budget_usd_per_hour" if self.mode == "budget" else "target_rps": self.limit,
            "best": self.best.to_dict() if self.best else None,
            "frontier": [s.to_dict() for s in self.frontier()],
            "evaluated": len(self.evaluated),
            "replays": self.sims,
            "cache_hits": self.cache_hits,
            "written": self.written,
        }


class Search:
    """Runs the candidates' evaluations (a process pool when jobs > 1) through the cache."""

    def __init__(
        self,
        plan: Plan,
        source,
        *,
        seed: int = 0,
        jobs: int = 1,
        cache: Cache | None = None,
        progress: Callable[[int, int | None], None] | None = None,
        precision: float = 0.05,
        evaluator: Callable[[Replicas], Score] | None = None,
    ):
        self.plan, self.source, self.seed, self.jobs = plan, source, seed, max(1, jobs)
        self.space = Space.of(plan)
        self.cache = cache or Cache(None)
        self.progress = progress
        self.precision = precision
        self.evaluator = evaluator  # tests: an analytic score instead of the simulator
        self.scores: dict[Replicas, Score] = {}
        self.done = 0
        self._base = (
            None
            if evaluator is not None
            else json.dumps(
                {
                    "v": CACHE_VERSION,
                    "code": code_digest(),
                    "plan": plan_digest(plan),
                    "wl": source.key(),
                    "seed": seed,
                },
                sort_keys=True,
            )
        )

    def _key(self, r: Replicas, mode: str, rate: float, factor: float) -> str:
        raw = f"{self._base}|{mode}|{rate:.6g}|{factor:g}|{self.precision:g}|{r}"
        return hashlib.sha256(raw.encode()).hexdigest()

    def run(
        self, cands: Iterable[Replicas], mode: str, rate: float, factor: float = 2.0
    ) -> list[Score]:
        """Scores of `cands` not scored yet. mode capacity: `rate` is where the capacity search
        starts, `factor` its bracketing step; mode target: the rate they must sustain."""
        todo = [r for r in dict.fromkeys(cands) if r not in self.scores]
        if self.evaluator is not None:
            for r in todo:
                self.scores[r] = self.evaluator(r)
                self._tick()
        else:
            self._simulate(todo, mode, rate, factor)
        shapes = shapes_of(self.plan)
        for r in todo:
            self.scores[r].shapes = shapes
        return [self.scores[r] for r in todo]

    def _simulate(self, todo: list[Replicas], mode: str, rate: float, factor: float) -> None:
        """Scores from the cache, or replayed (in the pool) and cached."""
        missing = []
        for r in todo:
            hit = self.cache.get(self._key(r, mode, rate, factor))
            if hit is not None:
                self.scores[r] = Score.from_dict(hit)
                self._tick()
            else:
                missing.append(r)
        tasks = [
            (
                self.plan,
                self._named(r),
                self.space.host_gib(r),
                self.source,
                self.seed,
                mode,
                rate,
                self.precision,
                factor,
            )
            for r in missing
        ]
        if self.jobs > 1 and len(tasks) > 1:
            with ProcessPoolExecutor(max_workers=min(self.jobs, len(tasks))) as pool:
                results = []
                for res in pool.map(evaluate, tasks):
                    results.append(res)
                    self._tick()
        else:
            results = []
            for t in tasks:
                results.append(evaluate(t))
                self._tick()
        for r, res in zip(missing, results):
            self.cache.put(self._key(r, mode, rate, factor), res)
            self.scores[r] = Score.from_dict(res)
        self.cache.save()

    def _named(self, r: Replicas) -> dict[str, int]:
        return dict(zip(self.space.names, r))  # zip stops before the host-tier rung

    def _tick(self) -> None:
        self.done += 1
        if self.progress:
            self.progress(self.done, None)

    def sims(self) -> int:
        return sum(s.sims for s in self.scores.values())


def size_budget(
    search: Search, budget: float, start_rps: float, exhaustive_max: int = 24
) -> Sizing:
    """The candidate with the most SLA goodput costing at most `budget` $/h (ties: cheaper)."""
    sp = search.space
    cands = [r for r in sp.all(budget) if sp.maximal(r, budget)]
    hint = start_rps
    if cands:
        # one candidate's capacity, searched from start_rps, is where the others' searches start
        # (and bracket in steps of 1.5): same-budget candidates have similar capacities
        probe = sorted(cands, key=lambda r: (sp.cost(r), r))[len(cands) // 2]
        (first,) = search.run([probe], "capacity", start_rps) or [search.scores[probe]]
        hint = first.rps if first.rps > 0 else start_rps
        if len(cands) <= exhaustive_max:
            search.run(cands, "capacity", hint, HINTED_FACTOR)
        else:
            _pattern(search, cands, hint)
    scored = [r for r in cands if r in search.scores]
    best = max(scored, key=lambda r: _rank(search.scores[r]), default=None)
    if best is not None and search.scores[best].slo_goodput_rps <= 0:
        best = None  # no candidate has 95% of requests within the SLA at any rate tried
    if best is not None:
        best = _trim(search, best, hint)
    return Sizing(
        search.plan.source,
        "budget",
        budget,
        search.scores[best] if best is not None else None,
        list(search.scores.values()),
        search.cache.hits,
        search.sims(),
    )


def _rank(s: Score) -> tuple[float, float]:
    return (s.slo_goodput_rps, -s.cost_per_hour)


def _trim(search: Search, best: Replicas, hint: float) -> Replicas:
    """Replicas the best does not need: while one replica fewer of some operator (or a smaller
    host tier) keeps the goodput within the capacity search's precision of the best's and buys
    more goodput per dollar, take the one that buys the most (a maximal candidate spends the
    whole budget, needed or not; a goodput difference below the precision is not resolved by the
    search, so it does not pay for a replica)."""
    floor = search.scores[best].slo_goodput_rps * (1 - search.precision)
    ops = len(search.space.names)
    while True:
        fewer = [best[:i] + (best[i] - 1,) + best[i + 1 :] for i in range(ops) if best[i] > 1]
        if search.space.rungs and best[-1] > 0:  # a smaller host tier
            fewer.append(best[:-1] + (best[-1] - 1,))
        search.run(fewer, "capacity", hint, HINTED_FACTOR)
        bcr = search.scores[best].bcr
        better = [
            r
            for r in fewer
            if search.scores[r].slo_goodput_rps >= floor and search.scores[r].bcr > bcr
        ]
        if not better:
            return best
        best = max(better, key=lambda r: (search.scores[r].bcr, r))


def _pattern(search: Search, cands: list[Replicas], start_rps: float) -> None:
    """Coarse grid (each operator's range in ~4 steps), then the best point's neighbours among the
    maximal candidates, at halving steps, until a step of one finds nothing better."""
    n = len(cands[0])
    spans = [max(r[i] for r in cands) - min(r[i] for r in cands) for i in range(n)]
    step = max(1, math.ceil(max(spans) / 4))

    def near(center: Replicas, s: int) -> list[Replicas]:
        return [r for r in cands if max(abs(a - b) for a, b in zip(r, center)) <= s]

    def best() -> Replicas:
        return max(
            (r for r in cands if r in search.scores),
            key=lambda r: (search.scores[r].slo_goodput_rps, -search.scores[r].cost_per_hour, r),
        )

    lows = [min(r[i] for r in cands) for i in range(n)]
    grid = [r for r in cands if all((r[i] - lows[i]) % step == 0 for i in range(n) if i < n - 1)]
    search.run(grid or cands[:1], "capacity", start_rps, HINTED_FACTOR)
    center = best()
    while True:
        search.run(near(center, step), "capacity", start_rps, HINTED_FACTOR)
        nxt = best()
        if nxt == center:
            if step == 1:
                return
            step = max(1, step // 2)
        center = nxt


def size_target(search: Search, target_rps: float) -> Sizing:
    """The cheapest candidate at which ATTAINMENT of requests meet the SLA at `target_rps`."""
    sp = search.space
    order = sorted(sp.all(), key=lambda r: (sp.cost(r), r))
    failed: list[Replicas] = []
    best = None
    i = 0
    while i < len(order) and best is None:
        batch = []
        while i < len(order) and len(batch) < search.jobs:
            r = order[i]
            i += 1
            if not any(all(a <= b for a, b in zip(r, f)) for f in failed):
                batch.append(r)
        if not batch:
            break
        for r, s in zip(batch, search.run(batch, "target", target_rps)):
            if s.meets and best is None:
                best = s
            elif not s.meets:
                failed.append(r)
    return Sizing(
        search.plan.source,
        "target",
        target_rps,
        best,
        list(search.scores.values()),
        search.cache.hits,
        search.sims(),
    )


def size(
    plan: Plan,
    make_search: Callable[[Plan], Search],
    *,
    budget: float | None = None,
    target_rps: float | None = None,
    start_rps: float = 1.0,
    exhaustive_max: int = 24,
) -> Sizing:
    """Size every combination of the operators' shapes (a plain graph has one) with
    `size_budget` or `size_target`; the best of them (most goodput, ties cheaper; or the cheapest
    meeting the target) wins, and every candidate scored is in `evaluated`."""
    if (budget is None) == (target_rps is None):
        raise ValueError("size needs one of budget and target_rps")
    runs: list[Sizing] = []
    done = hits = 0
    for combo in shape_combos(plan):
        search = make_search(with_shapes(plan, combo))
        search.done = done  # progress counts across the combinations
        before = search.cache.hits  # the combinations may share one cache
        if budget is not None:
            runs.append(size_budget(search, budget, start_rps, exhaustive_max))
        else:
            runs.append(size_target(search, target_rps))
        done, hits = search.done, hits + search.cache.hits - before
    bests = [r.best for r in runs if r.best is not None]
    if budget is not None:
        best = max(bests, key=_rank, default=None)
    else:
        best = min(bests, key=lambda s: s.cost_per_hour, default=None)
    return Sizing(
        plan.source,
        "budget" if budget is not None else "target",
        budget if budget is not None else target_rps,
        best,
        [s for r in runs for s in r.evaluated],
        hits,
        sum(r.sims for r in runs),
    )


def write_graph(source_file: str, best: Score, out: Path, note: str) -> Path:
    """The graph file with the winner's replica counts, shapes and host tiers (other keys as they
    were; comments go)."""
    import yaml

    data = yaml.safe_load(Path(source_file).read_text())
    for name, n in best.replicas.items():
        op = data["operators"][name]
        op["replicas"] = n
        if name in best.shapes:
            op["device"], op["devices_per_replica"] = best.shapes[name]
    for name, gib in best.host_gib.items():
        data["operators"][name]["host_cache"]["gib"] = gib
    data["name"] = f"{data['name']}_sized"
    out.write_text(f"# {note}\n" + yaml.safe_dump(data, sort_keys=False, width=100))
    return out
