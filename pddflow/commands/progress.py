"""Progress for commands that run longer than a few seconds: rich's live bar on a terminal; piped
(CI logs, `| tee`), where rich shows nothing until the end, plain lines instead, so a long run never
looks hung."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console

PLAIN_EVERY_S = 5.0  # a line at most this often per task, besides its start and its end


def console(stderr: bool = False) -> Console:
    """A console whose tables a pipe does not cut at rich's default of 80 columns."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 200)


def progress_bar(err: Console, counted: bool = False, transient: bool = True) -> Any:
    """A context manager with rich Progress's add_task / update / advance; `counted`: tasks have a
    total, shown as a bar and done/total."""
    if err.is_terminal:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        text = TextColumn("{task.description}")
        cols = (text, BarColumn(), MofNCompleteColumn()) if counted else (SpinnerColumn(), text)
        return Progress(*cols, TimeElapsedColumn(), console=err, transient=transient)
    return PlainProgress(err)


class PlainProgress:
    def __init__(self, err: Console):
        self.err = err
        self.tasks: list[dict[str, Any]] = []

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **_: Any) -> int:
        self.tasks.append(
            {"description": description, "total": total, "completed": 0, "start": time.monotonic()}
        )
        self._line(len(self.tasks) - 1)
        return len(self.tasks) - 1

    def update(
        self,
        task: int,
        description: str | None = None,
        completed: float | None = None,
        advance: float | None = None,
        **_: Any,
    ) -> None:
        t = self.tasks[task]
        changed = description is not None and description != t["description"]
        if description is not None:
            t["description"] = description
        if completed is not None:
            t["completed"] = completed
        if advance is not None:
            t["completed"] += advance
        finished = t["total"] is not None and t["completed"] >= t["total"]
        if changed or finished or time.monotonic() - t["last"] >= PLAIN_EVERY_S:
            self._line(task)

    def advance(self, task: int, advance: float = 1) -> None:
        self.update(task, advance=advance)

    def _line(self, task: int) -> None:
        t = self.tasks[task]
        t["last"] = time.monotonic()
        done = f" {t['completed']:g}/{t['total']:g}" if t["total"] is not None else ""
        elapsed = t["last"] - t["start"]
        print(f"{t['description']}{done} ({elapsed:.0f} s)", file=self.err.file, flush=True)
