"""A line-tracking YAML reader on top of PyYAML.

`read_yaml` returns the plain Python document plus a map from every document path to the line and
column of its key and value, so later stages can point at the exact place. It never raises for bad
content: undecodable bytes, YAML syntax errors, duplicate keys, unknown or recursive anchors and
multi-document files all become diagnostics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from pddflow.graph.diagnostics import Diagnostic, Path

MAX_BYTES = 4 * 1024 * 1024  # a graph is a few KB; anything this big is a mistake


@dataclass
class Source:
    file: str
    data: Any = None
    value_pos: dict[Path, tuple[int, int]] = field(default_factory=dict)
    key_pos: dict[Path, tuple[int, int]] = field(default_factory=dict)
    errors: list[Diagnostic] = field(default_factory=list)

    def where(self, path: Path, key: bool = False) -> tuple[int, int]:
        """Line and column of `path` (of its key when key=True and the path ends at a mapping key),
        falling back to the nearest enclosing path that was recorded."""
        p = tuple(path)
        while True:
            if key and p in self.key_pos:
                return self.key_pos[p]
            if p in self.value_pos:
                return self.value_pos[p]
            if not p:
                return (1, 1)
            p = p[:-1]

    def error(
        self, path: Path, message: str, key: bool = False, severity: str = "error"
    ) -> Diagnostic:
        line, col = self.where(path, key)
        d = Diagnostic(self.file, line, col, message, severity)
        self.errors.append(d)
        return d


def _pos(mark: Any) -> tuple[int, int]:
    return (mark.line + 1, mark.column + 1)


def _line_col(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    col = index - (text.rfind("\n", 0, index) + 1) + 1
    return line, col


class _Builder:
    """Turns a composed node tree into Python objects while recording positions."""

    MERGE_TAG = "tag:yaml.org,2002:merge"

    def __init__(self, src: Source):
        self.src = src
        self.scalars = yaml.SafeLoader("")  # only its scalar constructors are used
        self.active: set[int] = set()

    def build(self, node: yaml.Node, path: Path) -> Any:
        self.src.value_pos.setdefault(path, _pos(node.start_mark))
        if id(node) in self.active:
            self.src.error(
                path,
                "recursive YAML alias: this anchor refers to itself; write the value out instead",
            )
            return None
        if isinstance(node, yaml.ScalarNode):
            try:
                return self.scalars.construct_object(node, deep=True)
            except yaml.YAMLError as exc:
                self.src.error(path, f"cannot read this value: {getattr(exc, 'problem', exc)}")
                return None
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
            return self._mapping(node, path)
        finally:
            self.active.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: Path) -> dict:
        out: dict = {}
        seen: dict[Any, tuple[int, int]] = {}
        for key_node, value_node in node.value:
            if key_node.tag == self.MERGE_TAG:
                merged = self.build(value_node, path)
                for part in merged if isinstance(merged, list) else [merged]:
                    if isinstance(part, dict):
                        for k, v in part.items():
                            out.setdefault(k, v)
                    else:
                        self.src.error(
                            path, "'<<' merge needs a mapping (or a list of mappings) to merge in"
                        )
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self.src.error(path, "a mapping key must be a plain word, not a list or mapping")
                continue
            key = self.build(key_node, path + ("<key>",))
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                key = str(key)
            here = _pos(key_node.start_mark)
            if key in seen:
                line, col = seen[key]
                self.src.errors.append(
                    Diagnostic(
                        self.src.file,
                        here[0],
                        here[1],
                        f"duplicate key {key!r} (first defined at line {line}); YAML keeps only "
                        "one, so delete or rename one",
                    )
                )
                continue
            seen[key] = here
            self.src.key_pos[path + (key,)] = here
            out[key] = self.build(value_node, path + (key,))
        return out


def read_yaml(file: str, raw: bytes | None = None) -> Source:
    src = Source(file)
    try:
        if raw is None:
            with open(file, "rb") as fh:
                raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        src.errors.append(Diagnostic(file, 1, 1, f"cannot read file: {exc.strerror or exc}"))
        return src
    if len(raw) > MAX_BYTES:
        src.errors.append(
            Diagnostic(
                file,
                1,
                1,
                f"file is larger than {MAX_BYTES // 1024} KiB; is this really a graph file?",
            )
        )
        return src
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, col = _line_col(raw[: exc.start].decode("utf-8", "replace"), exc.start)
        src.errors.append(
            Diagnostic(
                file, line, col, "not UTF-8 text (a binary file?): a graph file is YAML text"
            )
        )
        return src
    if not text.strip() or all(
        not ln.strip() or ln.lstrip().startswith("#") for ln in text.splitlines()
    ):
        src.errors.append(
            Diagnostic(
                file, 1, 1, "file is empty: a graph starts with `pddflow: 1` (see `pddflow schema`)"
            )
        )
        return src
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = _pos(mark) if mark else (1, 1)
        problem = exc.problem or "invalid YAML"
        hint = ""
        if "found undefined alias" in problem:
            hint = "; define the anchor (&name) before using it (*name)"
        elif "found character '\\t'" in problem:
            hint = "; indent with spaces, not tabs"
        src.errors.append(Diagnostic(file, line, col, f"YAML syntax: {problem}{hint}"))
        return src
    except yaml.YAMLError as exc:  # ReaderError: control characters and the like
        pos = getattr(exc, "position", 0) or 0
        line, col = _line_col(text, min(pos, len(text)))
        reason = getattr(exc, "reason", None) or str(exc).splitlines()[0]
        src.errors.append(Diagnostic(file, line, col, f"not a YAML text file: {reason}"))
        return src
    nodes = [n for n in nodes if n is not None]
    if not nodes:
        src.errors.append(Diagnostic(file, 1, 1, "file is empty: a graph starts with `pddflow: 1`"))
        return src
    if len(nodes) > 1:
        line, col = _pos(nodes[1].start_mark)
        src.errors.append(
            Diagnostic(
                file, line, col, "more than one YAML document (`---`): put one graph per file"
            )
        )
    src.data = _Builder(src).build(nodes[0], ())
    if not isinstance(src.data, dict):
        src.errors.append(
            Diagnostic(
                file,
                1,
                1,
                "a graph file is a mapping with `pddflow: 1` at the top, "
                f"not a {type(src.data).__name__}",
            )
        )
        src.data = None
    return src
