"""The loop's console: a progress bar over the run's steps and a line per step that stays."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class StepProgress:
    """A progress bar over the run's steps, and a line per step that stays on the console."""

    def __init__(self, progress: Progress, total: int, completed: int) -> None:
        self.progress, self.total = progress, total
        self.bar = progress.add_task("", total=total, completed=completed)

    def step(self, step: int, line: str) -> None:
        self.progress.update(self.bar, advance=1, description=line)
        self.progress.console.print(f"step {step}/{self.total}: {line}", highlight=False)


@contextmanager
def progress_bar(name: str, console: Console, steps: int, start: int) -> Iterator[StepProgress]:
    """`with progress_bar(...) as progress: progress.step(step, line)`: the bar starts at `start` of `steps`."""
    columns = (
        TextColumn(name),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        yield StepProgress(progress, steps, start)
