"""Starting the servers the slow tests talk to: `clef-systemone` and `vllm serve` on the tiny checkpoint."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clef_quant.bench.processes import free_port, running, systemone_command

# A short model length and eager mode keep the tiny model's start to seconds; one whole prompt fits a step.
ENGINE_FLAGS = ["--max-model-len", "4096", "--enforce-eager", "--max-num-batched-tokens", "65536"]


@contextmanager
def vllm_serve(model: Path, log: Path, *flags: str) -> Iterator[str]:
    """`vllm serve` (the OpenAI server) with our architecture and the `clef` model name; yields its base URL."""
    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model),
        "--runner", "pooling",
        "--hf-overrides", '{"architectures": ["ClefFlashForJointSchema"]}',
        *flags,
        "--served-model-name", "clef",
        "--port", str(port),
        *ENGINE_FLAGS,
    ]  # fmt: skip
    with running(command, port, log):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def systemone(model: Path, log: Path, *flags: str) -> Iterator[tuple[str, list[int]]]:
    """`clef-systemone` with `flags`; yields its base URL and the /health codes it answered while starting."""
    port = free_port()
    with running(systemone_command(model, port, *flags), port, log) as statuses:
        yield f"http://127.0.0.1:{port}", statuses
