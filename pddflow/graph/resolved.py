"""What the edge and variant checks read once the compiler has resolved names (edges.py,
variants.py): the document, where findings go, each operator's type and the links. The checks
take this, not the compiler, so they sit below it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pddflow.core.link import LinkModel
from pddflow.core.operator_types import OperatorType
from pddflow.graph.diagnostics import Path
from pddflow.graph.spec import GraphSpec
from pddflow.graph.yaml_source import Source


@dataclass(frozen=True)
class Resolved:
    spec: GraphSpec
    src: Source  # findings go here, each at its line
    types: Mapping[str, OperatorType]  # operator name -> type, for operators that resolved
    links: Mapping[str, LinkModel]  # the well-formed links by name

    def err(self, path: Path, message: str, key: bool = False) -> None:
        self.src.error(path, message, key=key)
