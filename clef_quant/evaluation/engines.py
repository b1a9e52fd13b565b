"""Where the plugin sides' engines come from: one fresh `ClefEngine` per side, or any provider a caller passes."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH


class EngineProvider(Protocol):
    """Gives the runner a ClefEngine for a folder; `settings` (what changes the numbers) join the side key."""

    settings: dict[str, Any]

    def check(self, folder: Path) -> None:
        """Raise `SettingsError` or `CheckpointError` where an engine over `folder` could not start; starts nothing."""

    def open(self, folder: Path) -> Any:
        """A context manager yielding a `ClefEngine` over `folder`."""


class FreshEngines:
    """One new ClefEngine per side, freed before the next starts, so two engines never share the memory."""

    def __init__(
        self, *, max_model_len: int = DEFAULT_MAX_LENGTH, batch_invariant: bool = True, **engine_kwargs: Any
    ) -> None:
        self.max_model_len = max_model_len
        # Part of the settings (and so of the side keys): probabilities of a batch-variant engine are other numbers.
        self.engine_kwargs = {"batch_invariant": batch_invariant, **engine_kwargs}
        self.settings = {
            "max_model_len": max_model_len,
            **{k: repr(v) for k, v in sorted(self.engine_kwargs.items())},
        }

    def check(self, folder: Path) -> None:
        from clef_vllm.engine.check import check_engine_settings

        check_engine_settings(folder, max_model_len=self.max_model_len, **self.engine_kwargs)

    @contextmanager
    def open(self, folder: Path) -> Iterator[Any]:
        from clef_vllm.engine import ClefEngine

        holder = [ClefEngine(folder, max_model_len=self.max_model_len, **self.engine_kwargs)]
        try:
            yield holder[0]
        finally:
            holder[0].close()  # stop the engine core now, not whenever garbage collection gets to it
            holder.clear()
            gc.collect()
