"""pyproject.toml lists its packages (pddflow.kernels and pddflow.graphs are mapped in from kernels/
and graphs/, which discovery cannot see), so a new subpackage must be added there or the wheel ships
without it; the wheel carries the shipped graphs and the trace."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_is_listed_in_pyproject():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "pddflow").rglob("__init__.py")
    }
    on_disk |= {
        "pddflow.kernels." + ".".join(p.parent.relative_to(ROOT / "kernels").parts)
        for p in (ROOT / "kernels").rglob("*/__init__.py")
    }
    assert set(setup["packages"]) == on_disk | {"pddflow.kernels", "pddflow.graphs"}
    assert setup["package-dir"] == {"pddflow.kernels": "kernels", "pddflow.graphs": "graphs"}


def test_kernels_import_from_the_mapped_folder():
    import pddflow.kernels.paged_attention as attention

    assert Path(attention.__file__).resolve().parent == ROOT / "kernels"


@pytest.mark.slow  # builds the wheel (setuptools from the registry, as pip install does)
def test_the_wheel_ships_every_graph_and_the_trace(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(tmp_path)],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("pddflow-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    graphs = {
        f"pddflow/graphs/{p.relative_to(ROOT / 'graphs')}"
        for p in (ROOT / "graphs").rglob("*.yaml")
    }
    assert graphs and graphs <= names, graphs - names
    assert {"pddflow/data/mooncake_conversation_trace.jsonl", "pddflow/data/README.md"} <= names
