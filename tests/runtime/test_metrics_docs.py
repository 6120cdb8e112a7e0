"""Every metric family the frontend exports is listed in docs/runtime.md, and every metric the
Grafana dashboard (docs/grafana-pdd.json) queries is exported."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pddflow.runtime.frontend.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]


def _families() -> set[str]:
    m = Metrics()
    m.watch_workers({})
    m.watch_deployment("pdd", lambda: {"running": 0, "waiting": 0, "kv_usage": 0.0})
    body, _ = m.render()
    names = set()
    for f in text_string_to_metric_families(body.decode()):
        if f.name.endswith("_created"):  # prometheus_client's creation times, not families
            continue
        names.add(f.name + "_total" if f.type == "counter" else f.name)
    return names


def _base(name: str) -> str:
    for s in ("_bucket", "_count", "_sum"):
        if name.endswith(s):
            return name[: -len(s)]
    return name


def test_every_family_is_documented():
    doc = (ROOT / "docs" / "runtime.md").read_text()
    missing = sorted(n for n in _families() if f"`{n}`" not in doc)
    assert missing == []


def test_dashboard_queries_exported_metrics():
    families = _families()
    dash = json.loads((ROOT / "docs" / "grafana-pdd.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    queried = {_base(n) for e in exprs for n in re.findall(r"\b((?:pddflow_|vllm:)[a-z0-9_:]+)", e)}
    assert queried and sorted(queried - families) == []
    assert "pddflow_handoff_seconds" in queried and "pddflow_relay_token_share" in queried
