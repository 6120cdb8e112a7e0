"""The package's shape (docs/structure.md), checked on its source: imports point down the layers,
no two files import each other (type-only and function-local imports count), no module outgrows
500 lines, no two classes share a name, no retired name comes back (docs/structure.md, Glossary)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500
# the layers, lowest first (docs/structure.md); a package imports only from lower layers and
# itself, and packages of one layer never import each other, except where SIBLINGS says
LAYERS = [
    {"pddflow", "data", "kernels"},
    {"core"},
    {"graph"},
    {"channels", "operators"},
    {"scheduler", "planner"},
    {"runtime", "sim"},
    {"bench", "testing"},
    {"commands"},
    {"cli", "regen_protos"},
]
SIBLINGS = {("bench", "testing"), ("testing", "bench")}  # harnesses that drive each other


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for pddflow/ and kernels/ (installed as pddflow.kernels)."""
    out = {}
    trees = ((ROOT / "pddflow", ("pddflow",)), (ROOT / "kernels", ("pddflow", "kernels")))
    for base, prefix in trees:
        for path in base.rglob("*.py"):
            if path.name.endswith("_pb2.py"):
                continue
            parts = prefix + path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The pddflow modules `module` imports anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


@cache
def _graph() -> nx.DiGraph:
    modules = _modules()
    g = nx.DiGraph()
    for module, path in modules.items():
        g.add_node(module)
        g.add_edges_from((module, other) for other in _imported(module, path, modules))
    return g


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "pddflow"


def test_no_two_files_import_each_other():
    cycles = [sorted(c) for c in nx.strongly_connected_components(_graph()) if len(c) > 1]
    assert cycles == [], "import circles (move a type down, or type it with a Protocol)"


def test_imports_point_down_the_layers():
    layer = {p: i for i, ps in enumerate(LAYERS) for p in ps}
    wrong = []
    for a, b in _graph().edges:
        pa, pb = _package(a), _package(b)
        if pa == pb or (pa, pb) in SIBLINGS:
            continue
        if layer.get(pb, len(LAYERS)) >= layer.get(pa, -1):
            wrong.append(f"{a} -> {b}")
    assert wrong == []


def test_no_module_over_500_lines():
    long = {
        m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, "split these by what they hold"


def test_no_two_classes_share_a_name():
    where: dict[str, list[str]] = {}
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(module)
    assert {name: ms for name, ms in where.items() if len(ms) > 1} == {}


# a concept's retired names (regular expressions) -> its one name (docs/structure.md, Glossary,
# where each retired name appears once, as "`name` (now ...)")
RETIRED = {
    "one_shot_above_load": "catch_up_load",
    "job_overhead_s": "prefill_overhead_s",
    "relay_finishes": "singular",
    "finisher": "main",
    # the operator that takes a request and prefills it (prefill, or colocated) is `prefill`;
    # "entry" stays a plain word (a dict's entry, a package's entry point)
    r"\.entry(?!-)|pick_entry|entry (?:instance|pool|operator)s?": "prefill",
    # "cut" is a link's (the admin drill); a handoff is split into batches
    r"handoff_cut|HandoffCut|handoff's cut": "HandoffBatches",
}


def test_retired_names_stay_retired():
    found = [(re.compile(rf"\b(?:{old})\b(?!` \(now)"), new) for old, new in RETIRED.items()]
    places = [ROOT / "README.md", *(ROOT / d for d in ("pddflow", "tests", "docs", "graphs"))]
    files = [f for p in places for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
    hits = {
        f"{f.relative_to(ROOT)}:{n}": f"{m.group(0)} (now {new})"
        for f in files
        if f.suffix in (".py", ".md", ".yaml", ".proto") and f != Path(__file__)
        for n, line in enumerate(f.read_text().splitlines(), 1)
        for pattern, new in found
        if (m := pattern.search(line))
    }
    assert hits == {}


def test_the_checker_sees_a_circle_and_an_upward_import(tmp_path):
    """The two checks above can fail: a relative import both ways is a circle to them."""
    pkg = tmp_path / "pddflow" / "core"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text(
        "def f():\n    from pddflow.core.a import x  # local: still an edge\n"
    )
    modules = {
        "pddflow.core": pkg / "__init__.py",
        "pddflow.core.a": pkg / "a.py",
        "pddflow.core.b": pkg / "b.py",
    }
    assert _imported("pddflow.core.a", pkg / "a.py", modules) == {"pddflow.core.b"}
    assert _imported("pddflow.core.b", pkg / "b.py", modules) == {"pddflow.core.a"}
