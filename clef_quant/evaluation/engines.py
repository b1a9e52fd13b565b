"""Where the plugin sides' engines come from: one fresh `ClefEngine` per side, or any provider a caller passes."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from clef_vllm.engine.engine_settings import EngineSettings
from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH


class EngineProvider(Protocol):
    """Gives the runner a ClefEngine for a folder; `settings` (what changes the numbers) join the side key."""

    settings: dict[str, Any]

    def check(self, folder: Path) -> None:
        """Raise `SettingsError` or `CheckpointError` where an engine over `folder` could not start; starts nothing."""

    def open(self, folder: Path) -> Any:
        """A context manager yielding a `ClefEngine` over `folder`."""


class FreshEngines:
    """One new ClefEngine per side, freed before the next starts, so two engines never share the memory; each is
    the `settings` given, for the side's folder."""

    def __init__(self, settings: EngineSettings) -> None:
        self.template = settings
        asked = settings.offline_kwargs()
        asked.pop("limits")
        self.max_model_len = asked.pop("max_model_len")
        # Part of the side keys: probabilities of a batch-variant engine, or another engine argument, are other
        # numbers. Only what was asked for is named, so the keys of earlier runs still match.
        self.settings = {"max_model_len": self.max_model_len, **{k: repr(v) for k, v in sorted(asked.items())}}

    @classmethod
    def from_keywords(
        cls, *, max_model_len: int = DEFAULT_MAX_LENGTH, batch_invariant: bool = True, **engine_kwargs: Any
    ) -> FreshEngines:
        """Engines with `ClefEngine`'s keywords, for a caller with no command line."""
        return cls(
            EngineSettings.from_keywords(
                "", max_model_len=max_model_len, batch_invariant=batch_invariant, **engine_kwargs
            )
        )

    def check(self, folder: Path) -> None:
        from clef_vllm.engine.check import check_settings

        check_settings(self.template.for_model(folder))

    @contextmanager
    def open(self, folder: Path) -> Iterator[Any]:
        from clef_vllm.engine import ClefEngine

        holder = [ClefEngine.from_settings(self.template.for_model(folder))]
        try:
            yield holder[0]
        finally:
            holder[0].close()  # stop the engine core now, not whenever garbage collection gets to it
            holder.clear()
            gc.collect()
