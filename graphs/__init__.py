"""The shipped graphs, installed as `pddflow.graphs` (found by name: pddflow/graph/shipped.py)."""
