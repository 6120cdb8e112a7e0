"""The graph layer and `pddflow validate` stay light: no torch, pyarrow or grpc."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "pyarrow", "grpc")


def _loaded_after(code: str) -> set[str]:
    probe = code + (
        "\nimport sys\nsys.stderr.write('HEAVY:' + ' '.join(sorted("
        f"m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return set(out.stderr.rsplit("HEAVY:", 1)[1].split())


def test_import_graph_is_light():
    assert (
        _loaded_after("import pddflow.graph, pddflow.graph.render, pddflow.graph.feasibility")
        == set()
    )


@pytest.mark.slow  # the whole CLI in a subprocess
def test_validate_command_is_light():
    code = (
        "import sys\nfrom pddflow.cli import app\n"
        f"sys.argv = ['pddflow', 'validate', {str(ROOT / 'graphs' / 'pdd.yaml')!r}]\n"
        "try:\n    app()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
    )
    assert _loaded_after(code) == set()
