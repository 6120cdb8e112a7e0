"""Renderers of a Plan: ascii (the terminal view), dot, mermaid and svg (through Graphviz). What
they share is in common.py, so each renderer imports that, never this package."""

from __future__ import annotations

from pddflow.graph.plan import Plan
from pddflow.graph.render import ascii_view, dot, mermaid
from pddflow.graph.render.common import FORMATS, RenderError

__all__ = ["FORMATS", "RenderError", "render"]


def render(plan: Plan, fmt: str = "ascii", variant: str | None = None) -> str:
    if fmt == "ascii":
        return ascii_view.render(plan, variant)
    if fmt == "dot":
        return dot.render(plan, variant)
    if fmt == "mermaid":
        return mermaid.render(plan, variant)
    if fmt == "svg":
        return dot.render_svg(plan, variant)
    raise RenderError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
