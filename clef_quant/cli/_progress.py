"""Rich progress bars behind the library's progress protocol (`start`, `advance`, `finish`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


class RichProgress:
    """One bar per named task; give it a stderr console so that stdout keeps only the results."""

    def __init__(self, console: Console) -> None:
        self._bars = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            redirect_stderr=False,
            redirect_stdout=False,
        )
        self._ids: dict[str, Any] = {}

    def __enter__(self) -> RichProgress:
        self._bars.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bars.__exit__(*exc)

    def start(self, task: str, total: int | None = None) -> None:
        self._ids[task] = self._bars.add_task(task, total=total)

    def advance(self, task: str, amount: int = 1) -> None:
        if task in self._ids:
            self._bars.advance(self._ids[task], amount)

    def finish(self, task: str) -> None:
        if task in self._ids:
            task_id = self._ids[task]
            total = self._bars.tasks[task_id].total
            if total is None:
                self._bars.update(task_id, total=1, completed=1)
            else:
                self._bars.update(task_id, completed=total)
