"""Helpers every command uses: one way to fail without a traceback, one way to load a graph, one
check of `--cpu-pinning`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import typer

GRAPH_HELP = "a graph file, or a shipped graph's name (pdd, cross_dc_pd, sim/pdd_88)"


def fail(message: str, code: int = 1) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def resolve_or_exit(graph: Path) -> Path:
    """`graph`'s file: a path, or the name of a shipped graph (`pdd`, `sim/pdd_88`); else exit 2."""
    from pddflow.graph.shipped import resolve_graph

    try:
        return resolve_graph(graph)
    except FileNotFoundError as exc:
        fail(str(exc), code=2)


def load_or_exit(graph: Path):
    """The compiled Plan of `graph` (a path or a shipped graph's name); on any problem print every
    diagnostic and exit 1."""
    from pddflow.graph import check_file

    graph = resolve_or_exit(graph)
    checked = check_file(str(graph))
    for d in checked.diagnostics:
        print(d, file=sys.stderr)
    if not checked.ok:
        fail(
            f"{graph} is not a valid graph ({len(checked.errors)} error(s)); "
            f"see `pddflow validate {graph}`"
        )
    return checked.plan


def check_cpu_pinning(value: str) -> str:
    """`--cpu-pinning` of deploy, bench serve and simulate: one of cpu_layout.MODES, or exit 2."""
    from pddflow.core.cpu_layout import MODES

    if value not in MODES:
        fail(f"--cpu-pinning must be one of {', '.join(MODES)}, not {value!r}", code=2)
    return value
