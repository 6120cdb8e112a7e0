"""The graph layer: spec, line-tracking loader, two-stage validation, compiler to a Plan, renderers
and feasibility arithmetic. Imports neither torch, pyarrow nor grpc: checking a graph is instant."""

from pddflow.graph.diagnostics import Diagnostic, GraphError
from pddflow.graph.load import Checked, check_file, load_plan
from pddflow.graph.plan import Plan

__all__ = ["Checked", "Diagnostic", "GraphError", "Plan", "check_file", "load_plan"]
