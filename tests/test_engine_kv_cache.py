"""An engine's own KV cache size (`--engine-arg kv_cache_memory_bytes=...`) against VLLM_CPU_KVCACHE_SPACE: the
engine argument wins, the variable is ignored for that engine with one warning, eval's results.json says what the
started engine used, and the card's Reproduce line carries every --engine-arg."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from plugins.engines import start_engine
from typer.testing import CliRunner

from clef_quant.cli import app
from clef_quant.evaluation.results import read_results
from clef_quant.publish.reproduce import _evaluate
from clef_quant.publish.results import EvalResults
from clef_vllm.engine import settings as engine_module
from clef_vllm.engine.settings import CPU_KV_CACHE_ENV, own_kv_cache

FIXTURES = Path(__file__).resolve().parents[1] / "eval" / "fixtures"
OWN_BYTES = 48 * 2**20  # not a whole number of GiB, so it cannot come from the variable


@pytest.fixture
def user_set_space(monkeypatch: pytest.MonkeyPatch) -> str:
    """VLLM_CPU_KVCACHE_SPACE as a user sets it (not the engine module's own default), warned about afresh."""
    monkeypatch.setenv(CPU_KV_CACHE_ENV, "1")
    monkeypatch.setattr(engine_module, "_warned", set())
    monkeypatch.setattr(engine_module, "_defaulted_kv_cache", [])
    return "1"


def test_the_variable_is_out_of_the_way_while_an_engine_with_its_own_size_starts(
    user_set_space: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for _ in range(2):  # two engines: one warning
        with own_kv_cache(OWN_BYTES):
            assert CPU_KV_CACHE_ENV not in os.environ
        assert os.environ[CPU_KV_CACHE_ENV] == user_set_space  # back for the engines that have no size of their own
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("warning: ")
    assert f"{CPU_KV_CACHE_ENV}=1" in warnings[0] and f"kv_cache_memory_bytes={OWN_BYTES}" in warnings[0]

    with own_kv_cache(None):  # no size of its own: the variable sizes the cache, as vLLM documents
        assert os.environ[CPU_KV_CACHE_ENV] == user_set_space


def test_the_modules_own_default_is_put_aside_without_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(CPU_KV_CACHE_ENV, raising=False)
    monkeypatch.setattr(engine_module, "_defaulted_kv_cache", [])
    engine_module.apply_cpu_defaults()  # an earlier engine of this process had no size of its own
    with own_kv_cache(OWN_BYTES):
        assert CPU_KV_CACHE_ENV not in os.environ
    assert os.environ[CPU_KV_CACHE_ENV] == engine_module.CPU_KV_CACHE_GIB
    assert capsys.readouterr().err == ""


def test_a_started_engine_uses_its_own_size_with_the_variable_set(
    tiny_dir: Path, user_set_space: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = start_engine(tiny_dir, max_model_len=1024, enforce_eager=True, kv_cache_memory_bytes=OWN_BYTES)
    try:
        assert engine.kv_cache_memory_bytes == OWN_BYTES  # 1 GiB when the variable won
    finally:
        engine.close()
    assert f"{CPU_KV_CACHE_ENV}=1" in capsys.readouterr().err


def test_eval_records_the_size_its_engines_used_and_the_card_repeats_the_engine_args(
    tiny_dir: Path, quantized_dir, user_set_space: str, tmp_path: Path
) -> None:
    runner = CliRunner()
    data, out = tmp_path / "data", tmp_path / "results"
    built = runner.invoke(
        app,
        ["build-data", "--out", str(data), "--source", str(FIXTURES), "--task", "boolq", "--per-task", "1",
         "--calibration-count", "0"],
    )  # fmt: skip
    assert built.exit_code == 0, built.output
    engine_args = [f"kv_cache_memory_bytes={OWN_BYTES}", "max_num_batched_tokens=1024"]
    result = runner.invoke(
        app,
        ["eval", "--reference", str(tiny_dir), "--candidate", str(quantized_dir("fp8-dynamic")), "--data", str(data),
         "--out", str(out), "--max-model-len", "1024", "--enforce-eager",
         *(word for arg in engine_args for word in ("--engine-arg", arg))],
    )  # fmt: skip
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stderr.count(f"warning: {CPU_KV_CACHE_ENV}=1") == 1

    written = json.loads((out / "results.json").read_text())
    used = {side["role"]: side["engine"] for side in written["sides"]}
    assert used["noise-floor"] == used["candidate"] == {"kv_cache_memory_bytes": OWN_BYTES}
    assert used["reference"] == {}  # transformers: no engine

    results = read_results(out)
    command = _evaluate(EvalResults(out, results, results.candidates[0]), out)
    assert command.endswith(" ".join(f"--engine-arg {arg}" for arg in sorted(engine_args)))
    assert "--enforce-eager" in command.split()


def test_the_server_configures_its_engine_with_its_own_size(
    tiny_dir: Path, user_set_space: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from clef_vllm.server.backend import EngineBackend
    from clef_vllm.server.settings import ServeConfig

    backend = EngineBackend(
        ServeConfig(model=str(tiny_dir), max_model_len=1024, engine_arg=(f"kv_cache_memory_bytes={OWN_BYTES}",))
    )
    backend.configure()  # what `clef-systemone` builds before it listens; the engine core starts from it
    assert backend.vllm_config.cache_config.kv_cache_memory_bytes == OWN_BYTES
    assert f"{CPU_KV_CACHE_ENV}=1" in capsys.readouterr().err
