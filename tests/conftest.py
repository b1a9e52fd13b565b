"""The suite's machinery is in tests/plugins/, one pytest plugin per job; here, what every test process needs first
and the small fixtures several modules share."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# One torch thread per process, for this process and every process it starts (CLI runs, servers, the README
# session). The tiny model's ops are far too small to split, and a second OpenMP thread spin-waits at every op's
# barrier: with any other busy process on two cores (the suite's own servers, a neighbour's job) a forward pass of
# the tiny model took 3.9 s instead of 0.12 s, and `clef-quant scan` 73 s of CPU instead of 11 s. vLLM does the same
# for its engine steps (`set_torch_threads_for_runtime`). Set before torch is imported; an explicit value wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Each plugin comes after the plugins it imports: pytest rewrites a plugin's asserts only if it imports the module
# itself, and warns about one that is already imported.
pytest_plugins = [
    "plugins.work_units",  # units of work and their order on two workers (pytest-xdist)
    "plugins.engine_starts",  # the session summary's engine starts
    "plugins.releases",  # tiny_dir, quantized_dir, family_dir, family_quantized: built once per run
    "plugins.engines",  # clef_engine: in-process engines shared by the tests that ask for the same one
    "plugins.shared_servers",  # shared_systemone, vllm_serve: started beside the suite
    "plugins.readme_session",  # the README and docs examples, run beside the suite
]


@pytest.fixture(scope="module")
def head() -> Any:
    """A random head at the small test config (test_head.CONFIG), the same weights in every module."""
    from test_head import make_head

    return make_head()


@pytest.fixture(scope="module")
def embeddings() -> Any:
    """Output-embedding rows for the head tests' vocabulary."""
    import torch
    from test_head import CONFIG, VOCAB

    return torch.randn(VOCAB, CONFIG.hidden_size, generator=torch.Generator().manual_seed(99))


@pytest.fixture
def live_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process that is alive for the test (a writer that has not finished), killed afterwards."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process
    process.kill()
    process.wait()
