"""One look for every long step's progress bar (profiling, training, writing, evaluating).

Bars go to the console the caller passes (stderr for the CLI) and disappear when a
console is not a terminal only if the caller asks: tests pass a quiet console.
"""
from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def make_progress(console: Console | None, transient: bool = False) -> Progress:
    """A rich Progress with description, bar, n/total, elapsed and remaining time.

    console=None gives a disabled Progress (library use without output)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=transient,
        disable=console is None,
    )
