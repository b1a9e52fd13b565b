"""Settings a command cannot use are refused before any work, in one `error:` line with exit status 2: before
`clef-systemone` listens (it used to listen, then exit 3 once its engine died, a crash loop under a supervisor),
before `eval` scores its reference (hours on a real model), before a benchmark starts an engine, and by
`ClefEngine` before vLLM starts. What is refused: engine argument values vLLM refuses, a KV cache that cannot hold
one prompt of the model's length, pipeline parallelism, remote code, online quantization or a `quantization`
other than the folder's own, a CPU binding vLLM cannot parse, and dense NVFP4A16 on a CPU."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from clef_quant.cli import app
from clef_vllm.engine.cpu.threads import BIND_ENV
from clef_vllm.errors import CheckpointError, SettingsError

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = pytest.mark.unit(order=180)

FIXTURES = Path(__file__).resolve().parents[1] / "eval" / "fixtures"
ENGINE = ["--max-model-len", "4096", "--enforce-eager"]

# (id, --engine-arg values, words the one error line holds)
ENGINE_ARG_CASES = [
    ("seed-not-a-number", ["seed=abc"], ["seed", "valid integer"]),
    ("kv-cache-negative", ["kv_cache_memory_bytes=-1"], ["kv_cache_memory_bytes=-1", "positive"]),
    ("kv-cache-one-byte", ["kv_cache_memory_bytes=1"], ["kv_cache_memory_bytes=1", "max_model_len=4,096"]),
    ("kv-cache-below-a-prompt", ["kv_cache_memory_bytes=2000000"], ["kv_cache_memory_bytes=2000000", "at least"]),
    ("pipeline-parallel", ["pipeline_parallel_size=2"], ["pipeline_parallel_size", "pipeline parallelism"]),
    ("online-quantization", ["quantization=fp8"], ["quantization", "online quantization", "clef-quant quantize"]),
    ("remote-code", ["trust_remote_code=true"], ["trust_remote_code", "refused"]),
]


def one_error_line(text: str) -> str:
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture
def never_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clef-systemone that got as far as listening has missed its refusal (and would wait for clients here)."""
    import uvicorn

    def listened(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("clef-systemone listened before refusing its settings")

    monkeypatch.setattr(uvicorn.Server, "run", listened)
    # vLLM's log handlers may still hold an earlier test's closed stderr; its "Logging error" report is not ours.
    monkeypatch.setattr(logging, "raiseExceptions", False)


def server_refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    from clef_vllm.server.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    return one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("values", "words"), [case[1:] for case in ENGINE_ARG_CASES], ids=[c[0] for c in ENGINE_ARG_CASES]
)
def test_clef_systemone_refuses_engine_settings_before_it_listens(
    tiny_dir: Path, never_listens: None, capsys: pytest.CaptureFixture[str], values: list[str], words: list[str]
) -> None:
    argv = ["--model", str(tiny_dir), *ENGINE, *(arg for value in values for arg in ("--engine-arg", value))]
    line = server_refusal(argv, capsys)
    assert all(word in line for word in words), line


def test_clef_systemone_refuses_a_quantization_other_than_the_folders(
    quantized_dir: Any, never_listens: None, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = quantized_dir("fp8-dynamic")
    line = server_refusal(["--model", str(folder), *ENGINE, "--engine-arg", "quantization=fp8"], capsys)
    assert "quantization" in line and "compressed-tensors" in line


@pytest.mark.parametrize("binding", ["a|b", "0|", "0|1-x", "0|7-3"])
def test_clef_systemone_refuses_a_cpu_binding_vllm_cannot_read(
    tiny_dir: Path,
    never_listens: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    binding: str,
) -> None:
    monkeypatch.setenv(BIND_ENV, binding)
    line = server_refusal(["--model", str(tiny_dir), *ENGINE, "--dp", "2"], capsys)
    assert line.startswith(f"error: {BIND_ENV}={binding!r}: "), line


def test_clef_systemone_refuses_dense_nvfp4a16_on_a_cpu(
    quantized_dir: Any, never_listens: None, capsys: pytest.CaptureFixture[str]
) -> None:
    line = server_refusal(["--model", str(quantized_dir("nvfp4a16")), *ENGINE], capsys)
    assert "NVFP4A16" in line and "nvfp4" in line and "w4a16" in line


# -- clef-quant eval and the benchmarks --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("refusals") / "data"
    built = CliRunner().invoke(
        app,
        ["build-data", "--out", str(out), "--source", str(FIXTURES), "--task", "boolq", "--per-task", "2",
         "--calibration-count", "0", "--tokenizer", str(tiny_dir)],
    )  # fmt: skip
    assert built.exit_code == 0, built.output
    return out


def eval_refusal(reference: Path, candidate: Path, data: Path, out: Path, *extra: str) -> str:
    result = CliRunner().invoke(
        app,
        ["eval", "--reference", str(reference), "--candidate", str(candidate), "--data", str(data), "--out", str(out),
         "--max-model-len", "4096", "--enforce-eager", *extra],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert not out.exists()  # nothing scored, nothing written
    return one_error_line(result.output)


@pytest.mark.parametrize(
    ("values", "words"), [case[1:] for case in ENGINE_ARG_CASES], ids=[c[0] for c in ENGINE_ARG_CASES]
)
def test_eval_refuses_engine_settings_before_the_reference_scores(
    tiny_dir: Path, quantized_dir: Any, data_dir: Path, tmp_path: Path, values: list[str], words: list[str]
) -> None:
    extra = [arg for value in values for arg in ("--engine-arg", value)]
    line = eval_refusal(tiny_dir, quantized_dir("fp8-dynamic"), data_dir, tmp_path / "results", *extra)
    assert all(word in line for word in words), line


def test_eval_refuses_dense_nvfp4a16_on_a_cpu_before_the_reference_scores(
    tiny_dir: Path, quantized_dir: Any, data_dir: Path, tmp_path: Path
) -> None:
    line = eval_refusal(tiny_dir, quantized_dir("nvfp4a16"), data_dir, tmp_path / "results")
    assert "NVFP4A16" in line and "nvfp4a16" in line


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "latency", "--release", "{tiny}", "--out", "{tmp}/latency.md"],
        ["bench", "throughput", "--reference", "{tiny}", "--data", "{data}", "--out", "{tmp}/throughput.md"],
        ["bench", "modes", "--release", "{tiny}@invariant", "--out", "{tmp}/modes.md"],
    ],
    ids=["latency", "throughput", "modes"],
)
@pytest.mark.parametrize("value", ["seed=abc", "kv_cache_memory_bytes=1", "trust_remote_code=true"])
def test_benchmarks_refuse_engine_settings_before_any_engine_starts(
    tiny_dir: Path, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str], value: str
) -> None:
    import clef_vllm.engine

    def started(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an engine started before the refusal")

    # Both ways in (`ClefEngine(...)` and `ClefEngine.from_settings`, the benchmarks') start through `_start`.
    monkeypatch.setattr(clef_vllm.engine.ClefEngine, "_start", started)
    args = [part.format(tiny=tiny_dir, tmp=tmp_path, data=data_dir) for part in command]
    result = CliRunner().invoke(app, [*args, "--enforce-eager", "--engine-arg", value])
    assert result.exit_code == 2, result.output
    assert value.split("=")[0] in one_error_line(result.output)
    assert list(tmp_path.iterdir()) == []


# -- ClefEngine --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("folder", "kwargs", "error", "words"),
    [
        ("tiny", {"trust_remote_code": True}, SettingsError, "trust_remote_code"),
        ("tiny", {"pipeline_parallel_size": 2}, SettingsError, "pipeline parallelism"),
        ("tiny", {"quantization": "fp8"}, SettingsError, "online quantization"),
        ("fp8-dynamic", {"quantization": "fp8"}, SettingsError, "compressed-tensors"),
        ("nvfp4a16", {}, CheckpointError, "NVFP4A16"),
    ],
    ids=["remote-code", "pipeline", "online-quantization", "other-quantization", "nvfp4a16-on-cpu"],
)
def test_clef_engine_refuses_before_vllm_starts(
    tiny_dir: Path,
    quantized_dir: Any,
    monkeypatch: pytest.MonkeyPatch,
    folder: str,
    kwargs: dict[str, Any],
    error: type[Exception],
    words: str,
) -> None:
    import vllm

    from clef_vllm.engine import ClefEngine

    def started(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("vLLM started before the refusal")

    monkeypatch.setattr(vllm, "LLM", started)
    model = tiny_dir if folder == "tiny" else quantized_dir(folder)
    with pytest.raises(error, match=words):
        ClefEngine(model, max_model_len=4096, enforce_eager=True, **kwargs)


# -- the KV cache floor ------------------------------------------------------------------------------------------


def test_the_kv_cache_floor_never_refuses_a_size_vllm_would_run(clef_engine: Any, tiny_dir: Path) -> None:
    """Below the floor vLLM refuses the engine too (its own check, on the started engine's layers); twice the floor
    it runs one prompt of max_model_len (vLLM pads pages to one size across layer kinds, so it needs more)."""
    from plugins.engines import ENGINE_MAX_MODEL_LEN, small_kv_cache
    from vllm.v1.core.kv_cache_utils import check_enough_kv_cache_memory

    from clef_vllm.engine.check import engine_config, environment_kept, kv_cache_floor
    from clef_vllm.engine.offline import _in_process_core
    from clef_vllm.engine.settings import engine_args

    engine = clef_engine(tiny_dir)
    with small_kv_cache() as kv_cache, environment_kept():
        args = engine_args(tiny_dir, max_model_len=ENGINE_MAX_MODEL_LEN, enforce_eager=True, **kv_cache)
        floor = kv_cache_floor(engine_config(tiny_dir, args, batch_invariant=True))
    started = engine.llm.llm_engine.vllm_config
    (specs,) = _in_process_core(engine.llm).model_executor.get_kv_cache_specs()
    with pytest.raises(ValueError, match="To serve at least one request"):
        check_enough_kv_cache_memory(started, specs, floor - 1)
    check_enough_kv_cache_memory(started, specs, 2 * floor)
