"""Helpers every command uses: one way to fail without a traceback, one way to load a graph, one
check of `--cpu-pinning`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import typer


def fail(message: str, code: int = 1) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def load_or_exit(graph: Path):
    """The compiled Plan of `graph`; on any problem print every diagnostic and exit 1."""
    from pddflow.graph import check_file

    if not graph.exists():
        fail(f"{graph}: no such file", code=2)
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
