"""How the library reports progress without printing: the CLI passes an object that renders it (rich)."""

from __future__ import annotations

from typing import Protocol

# Task names the quantize run reports, in order.
LOADING = "loading"
ENCODING = "encoding calibration records"
CALIBRATING = "quantizing"
SAVING = "saving"
COPYING = "copying and hashing"


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
