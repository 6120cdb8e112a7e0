"""The multi-turn agentic workload of `pddflow bench serve`: the builder lives in
`pddflow.core.serve_sessions` (pure, shared with the simulator's `--serve-workload` replay); these
names stay importable from here."""

from __future__ import annotations

from pddflow.core.serve_sessions import (
    TRACE_BLOCK_TOKENS,
    SessionSpec,
    TraceError,
    WorkloadSpec,
    build,
    read_trace,
)

__all__ = ["TRACE_BLOCK_TOKENS", "SessionSpec", "TraceError", "WorkloadSpec", "build", "read_trace"]
