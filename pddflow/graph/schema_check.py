"""Schema stage: the document against the pydantic models, every error mapped to its line."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from pddflow.core.registry import did_you_mean
from pddflow.graph.diagnostics import Path
from pddflow.graph.spec import GraphSpec
from pddflow.graph.yaml_source import Source


def check_schema(src: Source) -> GraphSpec | None:
    try:
        return GraphSpec.model_validate(src.data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    errors = _drop_losing_union_branches(errors)
    for err in errors:
        path = _doc_path(src.data, err["loc"])
        _report(src, path, err)
    return None


def _report(src: Source, path: Path, err: dict) -> None:
    kind, where = err["type"], _dotted(path)
    if kind == "extra_forbidden":
        parent, key = path[:-1], path[-1]
        valid = _fields_at(parent)
        src.error(
            path,
            f"unknown key {key!r} in {_dotted(parent) or 'the top level'}"
            f"{did_you_mean(str(key), valid)}; valid keys: {', '.join(valid)}",
            key=True,
        )
    elif kind == "missing":
        parent, key = path[:-1], path[-1]
        help_ = _field_help(parent, key)
        src.error(
            parent,
            f"missing required key {key!r} in {_dotted(parent) or 'the top level'}"
            + (f" ({help_})" if help_ else ""),
            key=True,
        )
    elif kind == "literal_error" and path == ("pddflow",):
        src.error(
            path,
            f"unsupported format version {err.get('input')!r}: this pddflow reads `pddflow: 1`",
        )
    else:
        got = err.get("input")
        shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
        src.error(path, f"{where}: {err['msg'][0].lower()}{err['msg'][1:]} (got {shown})")


def _drop_losing_union_branches(errors: list[dict]) -> list[dict]:
    """A value that fails every branch of `str | Model` reports each branch; keep the branch its
    input was evidently meant for (a mapping for the model, anything else for the scalar)."""
    kept = []
    for err in errors:
        if err["type"] == "string_type" and isinstance(err.get("input"), dict):
            siblings = [
                e
                for e in errors
                if e is not err and e["loc"][: len(err["loc"]) - 1] == err["loc"][:-1]
            ]
            if siblings:
                continue
        if err["type"] == "model_type" and not isinstance(err.get("input"), dict):
            siblings = [
                e
                for e in errors
                if e is not err and e["loc"][: len(err["loc"]) - 1] == err["loc"][:-1]
            ]
            if siblings:
                continue
        kept.append(err)
    return kept


def _doc_path(data: Any, loc: tuple) -> Path:
    """pydantic's loc names union branches ('str', 'ArchNumbers') between real keys; follow only
    the parts that exist in the document (the last part may be a missing or unknown key)."""
    path: list = []
    node = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(part)
            node = node[part]
        elif last and isinstance(node, dict):
            path.append(part)
        # otherwise: a union branch tag; skip it
    return tuple(path)


def _model_at(path: Path) -> Any:
    """The pydantic model class that describes the mapping at `path`, if there is one."""
    tp: Any = GraphSpec
    for part in path:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = _find_field(tp, part)
            if field is None:
                return None
            tp = field.annotation
        elif typing.get_origin(tp) in (dict, list):
            tp = typing.get_args(tp)[-1]
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        models = [
            a for a in typing.get_args(tp) if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        return models[0] if models else tp
    return tp


def _find_field(model: type[BaseModel], key: Any) -> Any:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None


def _fields_at(path: Path) -> list[str]:
    model = _model_at(path)
    if model is None:
        return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _field_help(path: Path, key: Any) -> str:
    model = _model_at(path)
    field = _find_field(model, key) if model else None
    return (field.description or "") if field else ""


def _dotted(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
