"""How the library reports progress without printing: one protocol for every long piece of work.

A task is named as the user should read it ("encoding calibration records", "plugin NVFP4: warm-up"). It counts
steps (records, shards, or bytes with `unit=BYTES`) when they are known, and none when it is one piece of work.
The CLI passes an object that renders tasks (bars on stderr, `clef_quant.cli._stderr`); library code calls `start`
/ `advance` / `finish`, or `Stages` for consecutive pieces of work that count nothing, and never prints.
"""

from __future__ import annotations

from typing import Protocol

BYTES = "bytes"  # a task's unit when its steps are bytes written


class Progress(Protocol):
    def start(self, task: str, total: int | None = None, unit: str = "") -> None:
        """A task begins; `total` steps of `unit` when known."""

    def advance(self, task: str, amount: int = 1) -> None:
        """`amount` more steps of `task` are done."""

    def finish(self, task: str) -> None:
        """The task is complete."""


class NoProgress:
    """The default: report nothing."""

    def start(self, task: str, total: int | None = None, unit: str = "") -> None:
        pass

    def advance(self, task: str, amount: int = 1) -> None:
        pass

    def finish(self, task: str) -> None:
        pass


class Stages:
    """Consecutive pieces of work of one run: calling it with a task finishes the one before and starts this one."""

    def __init__(self, progress: Progress | None = None) -> None:
        self._progress = progress or NoProgress()
        self._current: str | None = None

    def __call__(self, task: str) -> None:
        self.done()
        self._progress.start(task)
        self._current = task

    def done(self) -> None:
        """The last piece of work is complete."""
        if self._current is not None:
            self._progress.finish(self._current)
            self._current = None
