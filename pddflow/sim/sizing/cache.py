"""The score cache of `pddflow size`: scores in one JSON file, keyed by the graph, the workload,
the seed and a digest of the simulator's code, so that a cached score is one a replay would
give again."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pddflow.graph.plan import Plan

CACHE_VERSION = 4  # 4: shapes (choices) and the host-tier rung in one key


def code_digest() -> str:
    """The simulator's code (sim, scheduler, graph, core): a cached score is only as good as it."""
    import pddflow

    root = Path(pddflow.__file__).parent
    h = hashlib.sha256()
    for sub in ("sim", "scheduler", "graph", "core"):
        for f in sorted((root / sub).rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def plan_digest(plan: Plan) -> str:
    d = plan.to_dict()
    for k in ("source", "operators", "instances"):
        d.pop(k, None)
    # the operators without their replica counts: the candidate's own key carries those
    d["operators"] = {
        n: {k: v for k, v in op.items() if k not in ("replicas", "instances")}
        for n, op in plan.to_dict()["operators"].items()
    }
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:20]


class Cache:
    """Scores by key in one JSON file (None: in memory only)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.data: dict[str, dict] = {}
        if path is not None and path.exists():
            try:
                self.data = json.loads(path.read_text())
            except (OSError, ValueError):
                self.data = {}
        self.hits = 0

    def get(self, key: str) -> dict | None:
        hit = self.data.get(key)
        self.hits += hit is not None
        return hit

    def put(self, key: str, value: dict) -> None:
        self.data[key] = value

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, sort_keys=True))
        os.replace(tmp, self.path)
