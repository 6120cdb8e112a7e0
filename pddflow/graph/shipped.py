"""The graphs shipped with pddflow (the repository's graphs/, installed as `pddflow.graphs`): a
command takes a graph by path, or by its name from any working directory (`pddflow deploy pdd`,
`sim/pdd_88`, `graphs/pdd.yaml` outside the repository)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def shipped_graphs() -> dict[str, Path]:
    """name -> file: `pdd`, `sim/pdd_88`, `examples/prfaas_remote_prefill`, ..."""
    root = Path(str(files("pddflow.graphs")))
    return {p.relative_to(root).with_suffix("").as_posix(): p for p in sorted(root.rglob("*.yaml"))}


def resolve_graph(arg: str | Path) -> Path:
    """`arg` if that file exists, else the shipped graph it names; FileNotFoundError says which
    names there are."""
    path = Path(arg)
    if path.exists():
        return path
    shipped = shipped_graphs()
    key = path.as_posix().removeprefix("graphs/").removesuffix(".yaml")
    by_stem = {Path(name).name: p for name, p in shipped.items()}
    found = shipped.get(key) or by_stem.get(key)
    if found is None:
        raise FileNotFoundError(
            f"{arg}: no such file, and no shipped graph of that name "
            f"(shipped: {', '.join(shipped)})"
        )
    return found
