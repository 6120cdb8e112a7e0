"""The side-by-side result tables that `bench serve` and `simulate` print: a metric per row, a
graph per column."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Row = tuple[str, Callable[[dict], str]]


def percentile_rows(label: str, key: str, fmt: str, upper: bool = False) -> list[Row]:
    """P50/P90/P99 rows of `result[key][q]`; `label` holds `{q}`, `fmt` is e.g. '.3f'."""
    return [
        (label.format(q=q.upper() if upper else q), lambda r, q=q: format(r[key][q], fmt))
        for q in ("p50", "p90", "p99")
    ]


def metric_table(title: str, columns: list[str], results: list[dict], rows: Iterable[Row]) -> Any:
    from rich.table import Table

    t = Table(title=title)
    t.add_column("metric")
    for c in columns:
        t.add_column(c, justify="right")
    for name, fn in rows:
        t.add_row(name, *[fn(r) for r in results])
    return t
