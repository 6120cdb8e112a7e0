"""pyproject.toml lists its packages (pddflow.kernels is mapped in from kernels/, which discovery
cannot see), so a new subpackage must be added there or the wheel ships without it."""

from __future__ import annotations

import tomllib
from pathlib import Path

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
    assert set(setup["packages"]) == on_disk | {"pddflow.kernels"}
    assert setup["package-dir"] == {"pddflow.kernels": "kernels"}


def test_kernels_import_from_the_mapped_folder():
    import pddflow.kernels.paged_attention as attention

    assert Path(attention.__file__).resolve().parent == ROOT / "kernels"
