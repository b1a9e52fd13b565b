"""How the library reports progress without printing: the CLI passes an object that renders it (rich bars on
stderr, `clef_quant.cli._progress`); library code calls `start` / `advance` / `finish` and never prints."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def start(self, task: str, total: int | None = None) -> None:
        """A task begins; `total` steps when known."""

    def advance(self, task: str, amount: int = 1) -> None:
        """`amount` more steps of `task` are done."""

    def finish(self, task: str) -> None:
        """The task is complete."""


class NoProgress:
    """The default: report nothing."""

    def start(self, task: str, total: int | None = None) -> None:
        pass

    def advance(self, task: str, amount: int = 1) -> None:
        pass

    def finish(self, task: str) -> None:
        pass
