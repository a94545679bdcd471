"""Progress bars of the command line's long work (``hiermem eval``, ``hiermem import``, ``hiermem bench``):
one look (description, bar, done/total, rate, elapsed, time left), drawn with rich on stderr, and only when
stderr is a terminal. A library call shows nothing unless asked (``progress=True``) and then still nothing
when its output is not a terminal; a callable given instead receives ``(done, total)``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

__all__ = ["RateColumn", "bar_columns", "question_progress", "terminal_progress"]


class RateColumn(ProgressColumn):
    """Items per second (per minute below one a second) of a task, e.g. ``"3.2 questions/min"``.

    Args:
        unit: the item's name (plural).
    """

    def __init__(self, unit: str = "items") -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if not speed:
            return Text(f"? {self.unit}/s", style="progress.data.speed")
        text = f"{speed:.1f} {self.unit}/s" if speed >= 1 else f"{speed * 60:.1f} {self.unit}/min"
        return Text(text, style="progress.data.speed")


def bar_columns(unit: str = "items") -> tuple[ProgressColumn, ...]:
    """The columns of every bar: description, bar, done/total, rate (``unit``), elapsed, time left."""
    return (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(unit),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )


@contextmanager
def terminal_progress(
    total: int, description: str, unit: str = "items", console: Console | None = None
) -> Iterator[Callable[[int], None]]:
    """A rich bar of ``total`` items while the block runs, when ``console`` (default: stderr) is a
    terminal; yields ``advance(n)`` (a no-op when nothing is shown)."""
    console = console or Console(stderr=True)
    if not console.is_terminal:
        yield lambda n=1: None
        return
    with Progress(*bar_columns(unit), console=console) as bars:
        task = bars.add_task(description, total=total)
        yield lambda n=1: bars.advance(task, n)


@contextmanager
def question_progress(
    progress: bool | Callable[[int, int], None] | Any, total: int, description: str
) -> Iterator[Callable[[int], None]]:
    """``advance(n)`` for ``n`` more questions answered: a :func:`terminal_progress` bar when ``progress``
    is ``True``, calls of ``progress(done, total)`` when it is callable, nothing when it is false."""
    if callable(progress):
        done = 0

        def advance(n: int = 1) -> None:
            nonlocal done
            done += int(n)
            progress(done, total)

        yield advance
    elif progress:
        with terminal_progress(total, description, "questions") as advance_bar:
            yield advance_bar
    else:
        yield lambda n=1: None
