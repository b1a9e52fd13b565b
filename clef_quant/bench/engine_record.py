"""The engine settings a benchmark's report records: what its flags asked for beyond what the report says apart."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clef_vllm.engine.engine_settings import EngineSettings

# Recorded in fields of their own (max_model_len), or as the mode a row runs in (batch_invariant), or not settings
# a flag of these commands gives (limits).
_RECORDED_APART = ("max_model_len", "limits", "batch_invariant")


def given_engine_settings(settings: EngineSettings) -> dict[str, Any]:
    """The engine settings `settings` hold beyond the defaults, in the order reports have always recorded them
    (--enforce-eager, then the --engine-arg values), so the same flags give the same recorded dict as before the
    commands built typed settings."""
    asked = settings.offline_kwargs()
    for key in _RECORDED_APART:
        asked.pop(key)
    eager = {"enforce_eager": asked.pop("enforce_eager")} if "enforce_eager" in asked else {}
    return {**eager, **asked}


def recorded_engine(settings: EngineSettings) -> dict[str, str]:
    """A report's `engine` field: each given setting's `repr`."""
    return {key: repr(value) for key, value in given_engine_settings(settings).items()}
