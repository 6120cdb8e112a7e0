"""Piped, a long command prints plain progress lines instead of rich's live bar (which shows
nothing off a terminal)."""

from __future__ import annotations

import io

from rich.console import Console

from pddflow.commands import progress


def test_piped_progress_prints_lines(monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)
    out = io.StringIO()
    with progress.progress_bar(Console(file=out), counted=True) as bar:
        task = bar.add_task("serving pdd", total=3)
        for _ in range(3):
            bar.advance(task)
        bar.update(task, description="done")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("serving pdd 0/3") and "serving pdd 3/3" in lines[-2]
    assert lines[-1].startswith("done 3/3")


def test_piped_progress_is_quiet_between_intervals():
    out = io.StringIO()
    with progress.progress_bar(Console(file=out)) as bar:
        task = bar.add_task("starting")
        for _ in range(50):
            bar.update(task)  # the same description, well within PLAIN_EVERY_S
    assert out.getvalue().count("\n") == 1
