"""Where vLLM keeps the structured decisions API that `vllm serve`'s `/v1/systemone` reads through.

vLLM 0.32 has it under `vllm.entrypoints.generate.structured_decisions`; 0.34 keeps the route there and moved the
question types and read strategies to `vllm.entrypoints.openai.decisions`, unchanged but for additions."""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Any

PACKAGES = ("vllm.entrypoints.openai.decisions", "vllm.entrypoints.generate.structured_decisions")


def decisions_module(name: str) -> ModuleType | None:
    """The API's module `name` (`strategies`, `question_types`) from this vLLM, or None for a build without it."""
    for package in PACKAGES:
        try:
            return importlib.import_module(f"{package}.{name}")
        except ImportError:
            continue
    return None


def decision_limits(limits_class: type, *, max_questions: int, max_options: int) -> Any:
    """vLLM's `DecisionLimits` for a read that scores options with the head, not with label tokens: vLLM 0.34
    caps a labeled read's options at its type's labels (`labeled`, absent in 0.32)."""
    fields = {field.name for field in dataclasses.fields(limits_class)}
    extra = {"labeled": False} if "labeled" in fields else {}
    return limits_class(max_questions=max_questions, max_options=max_options, **extra)
