"""The graph layer and `pddflow validate` stay light: no torch, pyarrow or grpc."""

from __future__ import annotations

from pathlib import Path

import pytest

from pddflow.testing.imports import heavy_after

ROOT = Path(__file__).resolve().parents[2]


def test_import_graph_is_light():
    assert (
        heavy_after("import pddflow.graph, pddflow.graph.render, pddflow.graph.feasibility")
        == set()
    )


@pytest.mark.slow  # the whole CLI in a subprocess
def test_validate_command_is_light():
    code = (
        "import sys\nfrom pddflow.cli import app\n"
        f"sys.argv = ['pddflow', 'validate', {str(ROOT / 'graphs' / 'pdd.yaml')!r}]\n"
        "try:\n    app()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
    )
    assert heavy_after(code) == set()
