"""Operator, channel and policy parameters against what their type declares."""

from __future__ import annotations

from typing import Any

from pddflow.core.operator_types import Param
from pddflow.core.registry import did_you_mean
from pddflow.graph.yaml_source import Source


def check_params(
    src: Source, at: tuple, declared: dict[str, Param], given: dict[str, Any], owner: str
) -> dict[str, Any]:
    """Every declared parameter with defaults filled in; unknown names and wrong types reported."""
    out = {k: p.default for k, p in declared.items()}
    for key, value in given.items():
        if key not in declared:
            valid = ", ".join(declared) or "none"
            src.error(
                at + (key,),
                f"{owner} has no parameter {key!r}{did_you_mean(str(key), declared)}; "
                f"parameters: {valid}",
                key=True,
            )
            continue
        want = declared[key].type
        ok = isinstance(value, want) and not (want is not bool and isinstance(value, bool))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok:
            src.error(
                at + (key,),
                f"{owner} parameter {key} must be {want.__name__} ({declared[key].help}), "
                f"got {value!r}",
            )
            continue
        if want in (int, float) and value < 0:
            src.error(at + (key,), f"{owner} parameter {key} must be >= 0, got {value!r}")
            continue
        choices = declared[key].choices
        if choices and value not in choices:
            src.error(
                at + (key,),
                f"{owner} parameter {key} must be one of "
                f"{', '.join(repr(c) for c in choices)}, got {value!r}"
                f"{did_you_mean(str(value), [str(c) for c in choices])}",
            )
            continue
        out[key] = value
    return out
