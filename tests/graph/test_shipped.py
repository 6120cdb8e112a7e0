"""Shipped graphs are found by name from any working directory, a file path wins over a name, and
an unknown name says which names there are."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pddflow.graph.shipped import resolve_graph

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "name", ["pdd", "pdd.yaml", "graphs/pdd.yaml", "sim/pdd_88", "pdd_88", "pdd_threshold"]
)
def test_names_resolve_from_anywhere(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = resolve_graph(name)
    assert got.is_file() and got.read_bytes() == (ROOT / "graphs" / shipped_name(name)).read_bytes()


def shipped_name(name: str) -> str:
    stem = name.removeprefix("graphs/").removesuffix(".yaml")
    return f"sim/{stem}.yaml" if stem == "pdd_88" else f"{stem}.yaml"


def test_a_file_beats_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pdd").write_text("mine")
    assert resolve_graph("pdd") == Path("pdd")


def test_an_unknown_name_lists_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no shipped graph of that name.*cross_dc_pd"):
        resolve_graph("pdd_typo")
    out = subprocess.run(
        [sys.executable, "-m", "pddflow.cli", "validate", "pdd_typo"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "sim/pdd_88" in out.stderr and "Traceback" not in out.stderr


def test_pdd_threshold_is_pdd_with_the_static_rule():
    """The baseline of `bench serve --wan-degrade`: the same deployment as pdd, only the policy
    differs (the peers' fixed uncached-tokens threshold, which never looks at the link)."""
    from dataclasses import replace

    from pddflow.graph import load_plan

    pdd = load_plan(str(ROOT / "graphs" / "pdd.yaml"))
    static = load_plan(str(resolve_graph("pdd_threshold")))
    assert static.scheduler.policy == "uncached_threshold"
    assert static.scheduler.params["threshold_tokens"] == 2048  # production tokens
    # deployed, in the served workload's tokens (`bench serve` scales the trace by 1/32)
    assert static.scaled_to_local().scheduler.params["threshold_tokens"] == 64
    assert [v.name for v in static.variants.values()] == ["p_md", "p_rld_md"]
    same = replace(
        static,
        name=pdd.name,
        scheduler=pdd.scheduler,
        source=pdd.source,
        local_scheduler_params=pdd.local_scheduler_params,
    )
    assert same == pdd
