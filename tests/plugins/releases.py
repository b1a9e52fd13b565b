"""The release folders the suite shares: the tiny Clef release, its quantized variants and the other Clef models.

Each is built on first use and then read by every test that asks for it; on two workers, one folder per run shared by
both workers, built by whichever asks first. Treat them as read-only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from plugins.work_units import in_worker

QUANTIZE_TEST_RECORDS = 4  # drawn from the shipped eval/calibration/default.jsonl (NVFP4 family only)


def build_root(factory: pytest.TempPathFactory, name: str) -> Path:
    """The folder a session fixture builds into; on workers, one folder shared by the run's workers."""
    if not in_worker():
        return factory.mktemp(name)
    root = factory.getbasetemp().parent / name
    root.mkdir(exist_ok=True)
    return root


def built_once(root: Path, key: str, build: Callable[[Path], Path]) -> Path:
    """`root / key`, made by `build(root / key)` unless a worker already made it: the first to ask builds under a
    lock and the others wait and read it (make-tiny and quantize write a folder whole or not at all)."""
    with FileLock(str(root / f"{key}.lock")):
        out = root / key
        return out if out.exists() else build(out)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight tiny Clef release (seed 0), built once per test run (~3 s). Treat it as read-only."""
    from clef_quant.tiny import make_tiny

    return built_once(build_root(tmp_path_factory, "release"), "tiny", lambda out: make_tiny(out, size="tiny", seed=0))


@pytest.fixture(scope="session")
def tokenizer(tiny_dir: Path) -> Any:
    """The tiny release's tokenizer, loaded once. Treat it as read-only."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def processor(tiny_dir: Path) -> Any:
    """The tiny release's processor (images and videos), loaded once. Treat it as read-only."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_dir)


# -- quantized tiny releases (clef-quant quantize); shared by the quantize, vLLM plugin and eval tests ----------


@pytest.fixture(scope="session")
def quantized_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`quantized_dir(scheme) -> Path`: `tiny_dir` quantized by clef-quant with `scheme` (fp8-dynamic, nvfp4,
    nvfp4-hybrid, nvfp4a16), built on first use and then shared by the whole session. Treat it as read-only."""
    from clef_quant.quantize.run import QuantizeConfig, quantize

    root = build_root(tmp_path_factory, "quantized")

    def build(scheme: str, out: Path) -> Path:
        config = QuantizeConfig(source=str(tiny_dir), out=out, scheme=scheme, calibration_records=QUANTIZE_TEST_RECORDS)
        return quantize(config).out

    @functools.cache
    def get(scheme: str) -> Path:
        return built_once(root, scheme, functools.partial(build, scheme))

    return get


# -- the other Clef models: clef-tiny (the 27B's architecture) and omni-tiny (Clef-Omni's) ----------------------


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`family_dir(size) -> Path`: a random-weight release of a make-tiny size (seed 0), built on first use and
    shared by the session. Treat it as read-only."""
    from clef_quant.tiny import make_tiny

    root = build_root(tmp_path_factory, "family")

    @functools.cache
    def get(size: str) -> Path:
        return built_once(root, size, lambda out: make_tiny(out, size=size, seed=0))

    return get


@pytest.fixture(scope="session")
def family_quantized(
    family_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str], Path]:
    """`family_quantized(size, scheme) -> Path`: `family_dir(size)` quantized with `scheme`, built on first use."""
    from clef_quant.quantize.run import QuantizeConfig, quantize

    root = build_root(tmp_path_factory, "family-quantized")

    def build(size: str, scheme: str, out: Path) -> Path:
        config = QuantizeConfig(
            source=str(family_dir(size)), out=out, scheme=scheme, calibration_records=QUANTIZE_TEST_RECORDS
        )
        return quantize(config).out

    @functools.cache
    def get(size: str, scheme: str) -> Path:
        return built_once(root, f"{size}-{scheme}", functools.partial(build, size, scheme))

    return get
