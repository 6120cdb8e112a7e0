"""The graph layer's front door: read a file, check it in two stages, compile it to a Plan."""

from __future__ import annotations

from dataclasses import dataclass, field

from pddflow.graph.compile import Compiler
from pddflow.graph.diagnostics import Diagnostic, GraphError
from pddflow.graph.plan import Plan
from pddflow.graph.schema_check import check_schema
from pddflow.graph.spec import GraphSpec
from pddflow.graph.yaml_source import read_yaml


@dataclass
class Checked:
    file: str
    spec: GraphSpec | None = None
    plan: Plan | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def ok(self) -> bool:
        return self.plan is not None and not self.errors


def check_file(file: str, raw: bytes | None = None) -> Checked:
    """YAML, then schema, then semantics; every problem found is in `diagnostics`, sorted by line.
    The semantic stage runs only on a file that passed the schema stage."""
    src = read_yaml(file, raw)
    out = Checked(file)
    if src.data is not None and not src.errors:
        out.spec = check_schema(src)
        if out.spec is not None:
            out.plan = Compiler(out.spec, src).compile()
    out.diagnostics = sorted(set(src.errors), key=lambda d: (d.line, d.col, d.message))
    return out


def load_plan(file: str) -> Plan:
    """The compiled Plan of a graph file, or GraphError carrying every diagnostic."""
    checked = check_file(file)
    if not checked.ok:
        raise GraphError(checked.errors)
    return checked.plan
