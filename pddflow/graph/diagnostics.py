"""Diagnostics: one finding about a graph file, printed as `FILE:LINE:COL: message`."""

from __future__ import annotations

from dataclasses import dataclass

Path = tuple  # a location in the document: keys and list indices, e.g. ("edges", 2, "to")


@dataclass(frozen=True, order=True)
class Diagnostic:
    file: str
    line: int
    col: int
    message: str
    severity: str = "error"  # or "warning"

    def __str__(self) -> str:
        tag = "" if self.severity == "error" else f"{self.severity}: "
        return f"{self.file}:{self.line}:{self.col}: {tag}{self.message}"


class GraphError(Exception):
    """Raised by the loading API when a graph file has errors; carries every diagnostic."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = diagnostics
        super().__init__("\n".join(str(d) for d in diagnostics))
