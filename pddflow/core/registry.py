"""The registry of every pluggable name; plugins extend it by entry point (docs/plugins.md)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownName(KeyError):
    def __init__(self, kind: str, name: str, valid: list[str]):
        self.kind, self.name, self.valid = kind, name, valid
        hint = did_you_mean(name, valid)
        super().__init__(f"unknown {kind} {name!r}{hint}; valid: {', '.join(valid) or '(none)'}")

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return self.args[0]


def did_you_mean(name: str, candidates: list[str] | set[str]) -> str:
    """' (did you mean 'x'?)' for the closest candidate, or '' when none is close."""
    close = difflib.get_close_matches(str(name), sorted(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Registry(Generic[T]):
    def __init__(self, kind: str, entry_point_group: str):
        self.kind = kind
        self.group = entry_point_group
        self._entries: dict[str, T] = {}
        self._plugins_loaded = False

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in entry_points(group=self.group):
            hook = ep.load()
            hook(self)

    def get(self, name: str) -> T:
        self._load_plugins()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownName(self.kind, name, self.names()) from None

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._entries

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
