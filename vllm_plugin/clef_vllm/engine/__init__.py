"""The engine layer: vLLM's Clef model class and read strategy, the offline `ClefEngine`, the settings an engine
starts with, how answers stay independent of load, and the CPU kernels. It builds on `clef_vllm.format` and
`clef_vllm.head`; the server builds on it.

    from clef_vllm.engine import ClefEngine
"""

from __future__ import annotations

from typing import Any

__all__ = ["ClefEngine"]


def __getattr__(name: str) -> Any:
    # vLLM imports the plugin (engine.plugin) in every process it starts: the offline API loads only when used.
    if name == "ClefEngine":
        from clef_vllm.engine.offline import ClefEngine

        return ClefEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
