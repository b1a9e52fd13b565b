"""Random-weight Clef releases (`clef-quant make-tiny`): the real folder layout, loadable by transformers and vLLM.

The builder imports torch; it is loaded on first use so that reading the sizes (the CLI's `--size` choices)
stays cheap.
"""

from __future__ import annotations

from typing import Any

from clef_quant.tiny.sizes import SIZES

__all__ = ["SIZES", "TinyBuildError", "make_tiny", "parameter_count"]

_LAZY = {
    "make_tiny": "clef_quant.tiny.build",
    "parameter_count": "clef_quant.tiny.build",
    "TinyBuildError": "clef_quant.tiny.checks",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(_LAZY[name]), name)
