"""Progress of long work: the ``progress=`` argument of ``add`` (and of commands that add many messages).

``progress`` is ``None`` (default, or ``False``: no output), ``True`` (a rich progress bar on standard
error, with messages done, rate and time left, shown only when standard error is a terminal) or a
callable ``progress(done, total)`` receiving the number of messages processed so far (``int``, never
decreasing, ending at ``total``) and the number in the call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Union

from .types import InvalidInputError

__all__ = ["ProgressLike", "check_progress", "progress_reporter"]

ProgressLike = Union[bool, Callable[[int, int], Any], None]
"""What ``progress=`` accepts: ``None`` / ``False``, ``True``, or ``callable(done, total)``."""


def check_progress(progress: Any) -> ProgressLike:
    """``progress`` checked (see the module).

    Raises:
        InvalidInputError: anything but ``None``, a bool or a callable (the message names the value).
    """
    if progress is None or isinstance(progress, bool) or callable(progress):
        return progress  # type: ignore[no-any-return]
    raise InvalidInputError(
        f"progress must be None, True (a progress bar on a terminal) or a callable(done, total), "
        f"got {progress!r}."
    )


@contextmanager
def progress_reporter(
    progress: ProgressLike, total: int, label: str = "messages"
) -> Iterator[Callable[[int], None]]:
    """A ``tick(done)`` callback for the block: forwards ``done`` (monotone: a smaller value than one
    already reported, as when a transaction is computed again, is not reported) to the callable, or
    advances a rich progress bar on standard error when ``progress is True`` and it is a terminal.

    Args:
        progress: a checked value (:func:`check_progress`).
        total: the number of items of the work.
        label: the bar's description.
    """
    last = [0]
    if callable(progress) and not isinstance(progress, bool):
        fn = progress

        def tick(done: int) -> None:
            if done > last[0]:
                last[0] = done
                fn(done, total)

        yield tick
        return
    if progress is not True or not sys.stderr.isatty():
        yield lambda done: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class _Rate(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(f"{task.speed:.1f}/s" if task.speed else "-/s")

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        _Rate(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=total)

        def advance(done: int) -> None:
            if done > last[0]:
                last[0] = done
                bar.update(task, completed=done)

        yield advance
