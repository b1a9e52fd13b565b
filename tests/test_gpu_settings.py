"""What an engine is started with on a GPU, checked on the CPU: the invariant schedule, the defaults, the
`--engine-arg` pass-through and the plugin's acceptance of Gated DeltaNet layers in vLLM's batch-invariant mode."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from clef_vllm.errors import SettingsError


def test_on_a_gpu_the_invariant_mode_batches_whole_prompts():
    from clef_vllm.engine.invariance import KERNELS
    from clef_vllm.engine.settings import schedule_args

    args = schedule_args(max_model_len=4096, method=KERNELS)
    assert args == {"enable_chunked_prefill": False, "max_num_batched_tokens": 16384}
    # A longer model length raises the step budget to hold the longest prompt whole.
    assert schedule_args(max_model_len=32768, method=KERNELS)["max_num_batched_tokens"] == 32768
    # Several prompts per step are the point on a GPU, so max_num_seqs is the user's.
    assert schedule_args(max_model_len=4096, max_num_seqs=64, method=KERNELS)["max_num_seqs"] == 64
    with pytest.raises(SettingsError, match="long prompts would be split across steps"):
        schedule_args(max_model_len=4096, max_num_batched_tokens=2048, method=KERNELS)


def test_on_a_cpu_the_invariant_mode_runs_one_prompt_per_step():
    from clef_vllm.engine.invariance import KERNELS, ONE_PROMPT_PER_STEP
    from clef_vllm.engine.settings import schedule_args

    assert schedule_args(max_model_len=4096, method=ONE_PROMPT_PER_STEP) == {
        "max_num_seqs": 1,
        "max_num_batched_tokens": 4096,
    }
    with pytest.raises(SettingsError, match="puts several prompts in one engine step, which here"):
        schedule_args(max_model_len=4096, max_num_seqs=8, method=ONE_PROMPT_PER_STEP)
    # Batched mode leaves vLLM's scheduler alone on either device.
    assert schedule_args(max_model_len=4096, batch_invariant=False, method=KERNELS) == {}


def test_nvfp4_releases_run_one_prompt_per_step_on_gpus_without_fp4_kernels(tiny_dir, quantized_dir):
    from clef_vllm.engine.invariance import KERNELS, ONE_PROMPT_PER_STEP, SPLIT_FREE, invariance_method

    nvfp4, fp8 = quantized_dir("nvfp4"), quantized_dir("fp8-dynamic")
    hopper, blackwell = 9, 10
    assert invariance_method(True, nvfp4, capability=hopper) == ONE_PROMPT_PER_STEP
    assert invariance_method(True, nvfp4, capability=blackwell) == KERNELS
    for folder in (tiny_dir, fp8):
        assert invariance_method(True, folder, capability=hopper) == SPLIT_FREE
    assert invariance_method(False, fp8) == ONE_PROMPT_PER_STEP


def test_a_gpu_engine_runs_triton_gdn_prefill_without_flashinfer_unless_told_otherwise(tiny_dir):
    from clef_vllm.engine.settings import engine_args

    pytest.importorskip("vllm")
    from vllm.utils.flashinfer import has_flashinfer

    if has_flashinfer():
        pytest.skip("FlashInfer is installed here: vLLM's own choice stands")
    assert engine_args(tiny_dir, gpu=True)["gdn_prefill_backend"] == "triton"
    assert engine_args(tiny_dir, gpu=True, gdn_prefill_backend="flashinfer")["gdn_prefill_backend"] == "flashinfer"
    assert "gdn_prefill_backend" not in engine_args(tiny_dir, gpu=False)


def test_a_gpu_engine_captures_graphs_for_whole_prompts_unless_told_otherwise(tiny_dir):
    from clef_vllm.engine.cuda_graphs import LARGEST_GRAPH_TOKENS
    from clef_vllm.engine.settings import engine_args

    pytest.importorskip("vllm")
    sizes = engine_args(tiny_dir, gpu=True, max_model_len=4096)["compilation_config"]["cudagraph_capture_sizes"]
    assert sizes == sorted(set(sizes)) and sizes[0] == 1
    # the step holds up to 16,384 tokens: graphs stop at the cap, and no prompt below it pads by a sixteenth or more
    assert sizes[-1] == LARGEST_GRAPH_TOKENS
    for tokens in (300, 553, 685, 1501, 6445, 7198):
        padded = next(size for size in sizes if size >= tokens)
        assert padded - tokens < tokens / 16, (tokens, padded)
    short = engine_args(tiny_dir, gpu=True, max_model_len=1000, max_num_batched_tokens=1000)
    assert short["compilation_config"]["cudagraph_capture_sizes"][-1] == 1000

    mine = engine_args(tiny_dir, gpu=True, compilation_config={"max_cudagraph_capture_size": 512, "mode": 3})
    assert mine["compilation_config"] == {"max_cudagraph_capture_size": 512, "mode": 3}
    merged = engine_args(tiny_dir, gpu=True, compilation_config={"mode": 3})["compilation_config"]
    assert merged["mode"] == 3 and merged["cudagraph_capture_sizes"] == sizes
    assert "compilation_config" not in engine_args(tiny_dir, gpu=True, enforce_eager=True)
    assert "compilation_config" not in engine_args(tiny_dir, gpu=False)


def test_whole_prompt_graphs_are_captured_with_few_enough_sequences_for_the_27b(tiny_dir):
    """vLLM captures a graph of N tokens with min(N, max_num_seqs) sequences, each with a Gated DeltaNet state: its
    default of 1,024 ran the 27B out of memory on an H100 at 8,192 tokens."""
    from clef_vllm.engine.cuda_graphs import CAPTURE_MAX_SEQS
    from clef_vllm.engine.settings import engine_args

    pytest.importorskip("vllm")
    assert CAPTURE_MAX_SEQS <= 256
    assert engine_args(tiny_dir, gpu=True)["max_num_seqs"] == CAPTURE_MAX_SEQS
    assert engine_args(tiny_dir, gpu=True, batch_invariant=False)["max_num_seqs"] == CAPTURE_MAX_SEQS
    assert engine_args(tiny_dir, gpu=True, max_num_seqs=512)["max_num_seqs"] == 512
    # sizes of the caller's own, or no graphs at all: vLLM's sequence count stands
    mine = engine_args(tiny_dir, gpu=True, compilation_config={"max_cudagraph_capture_size": 512})
    assert "max_num_seqs" not in mine
    assert "max_num_seqs" not in engine_args(tiny_dir, gpu=True, enforce_eager=True)


def test_engine_args_read_json_values_and_refuse_what_the_plugin_or_a_flag_sets():
    from clef_vllm.engine.options import engine_overrides

    given = engine_overrides(
        ["gpu_memory_utilization=0.5", 'compilation_config={"max_cudagraph_capture_size": 2048}', "seed=7"]
    )
    assert given == {
        "gpu_memory_utilization": 0.5,
        "compilation_config": {"max_cudagraph_capture_size": 2048},
        "seed": 7,
    }
    assert engine_overrides(["gdn-prefill-backend=triton"]) == {"gdn_prefill_backend": "triton"}
    refusals = {
        "runner=generate": "set by clef-vllm",
        "max_model_len=8": "use --max-model-len",
        "gpu_memory_utilisation=0.5": "did you mean gpu_memory_utilization",
        "seed": "takes KEY=VALUE",
    }
    for text, words in refusals.items():
        with pytest.raises(SettingsError, match=words):
            engine_overrides([text])
    with pytest.raises(SettingsError, match="given twice"):
        engine_overrides(["seed=1", "seed=2"])


def test_clef_systemone_passes_engine_args_to_the_engine_and_names_its_own_flags(tiny_dir, capsys):
    from clef_vllm.server.cli import main, parse_args

    config = parse_args(
        ["--model", str(tiny_dir), "--engine-arg", "seed=7", "--engine-arg", "kv_cache_memory_bytes=1073741824"]
    )
    engine = config.vllm_kwargs()
    assert (engine["seed"], engine["kv_cache_memory_bytes"]) == (7, 1073741824)
    with pytest.raises(SystemExit) as info:
        main(["--model", str(tiny_dir), "--engine-arg", "tensor_parallel_size=2"])
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "error: --engine-arg tensor_parallel_size=...: use --tp"


def test_eval_refuses_an_unknown_engine_arg_before_any_work(tmp_path):
    from clef_quant.cli import app

    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--reference",
            "r",
            "--candidate",
            "c",
            "--data",
            str(tmp_path / "data"),
            "--out",
            str(tmp_path / "out"),
            "--engine-arg",
            "no_such_argument=1",
        ],
    )
    assert result.exit_code == 2
    assert "vLLM has no engine argument 'no_such_argument'" in result.output
    assert not (tmp_path / "out").exists()


def test_an_engine_arg_reaches_the_running_engine(clef_engine, tiny_dir):
    from plugins.engines import ENGINE_KV_CACHE_BYTES

    engine = clef_engine(tiny_dir, seed=1234)
    config = engine.llm.llm_engine.vllm_config
    assert config.model_config.seed == 1234
    # The fixture's own KV cache size (an engine argument) is kept, not replaced by the CPU default of 2 GiB.
    assert config.cache_config.kv_cache_memory_bytes == ENGINE_KV_CACHE_BYTES


def test_the_cpu_kv_cache_default_is_set_only_for_an_engine_without_its_own_size(monkeypatch):
    import torch

    from clef_vllm.engine.settings import CPU_KV_CACHE_GIB, apply_cpu_defaults

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    apply_cpu_defaults(64 * 2**20)
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ
    apply_cpu_defaults()
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == CPU_KV_CACHE_GIB


def _vllm_config(*, chunked: bool, budget: int, length: int) -> SimpleNamespace:
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(enable_chunked_prefill=chunked, max_num_batched_tokens=budget),
        model_config=SimpleNamespace(max_model_len=length),
        cache_config=SimpleNamespace(enable_prefix_caching=True),
        additional_config={},
    )


@pytest.mark.parametrize("method", ["split-free", "vllm"])
def test_vllm_serve_in_an_invariant_mode_gets_whole_prompts_or_a_clear_refusal(method):
    from clef_vllm.engine.invariance import set_invariant_kernels, set_split_free_kernels
    from clef_vllm.engine.vllm_model import ClefFlashConfig

    # What `CLEF_SPLIT_FREE=1 vllm serve ...` or `VLLM_BATCH_INVARIANT=1 vllm serve ...` puts in the environment.
    set_on = set_split_free_kernels if method == "split-free" else set_invariant_kernels
    set_on(True)
    try:
        fits = _vllm_config(chunked=True, budget=16384, length=4096)
        ClefFlashConfig.verify_and_update_config(fits)
        assert fits.scheduler_config.enable_chunked_prefill is False
        assert fits.cache_config.enable_prefix_caching is False
        with pytest.raises(SettingsError, match="need whole prompts in a step"):
            ClefFlashConfig.verify_and_update_config(_vllm_config(chunked=True, budget=2048, length=4096))
    finally:
        set_on(False)
    untouched = _vllm_config(chunked=True, budget=2048, length=4096)
    ClefFlashConfig.verify_and_update_config(untouched)
    assert untouched.scheduler_config.enable_chunked_prefill is True


def test_the_clef_model_lifts_vllms_refusal_of_gdn_layers_in_batch_invariant_mode(monkeypatch):
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend

    from clef_vllm.engine.invariance import accept_gdn_layers

    monkeypatch.setattr(GDNAttentionBackend, "supports_batch_invariance", GDNAttentionBackend.supports_batch_invariance)
    assert GDNAttentionBackend.supports_batch_invariance() is False  # vLLM 0.32's own answer
    accept_gdn_layers()
    assert GDNAttentionBackend.supports_batch_invariance() is True


def test_the_split_free_method_batches_whole_prompts_and_is_chosen_by_name(tiny_dir, monkeypatch):
    from clef_vllm.engine.invariance import GPU_METHOD_ENV, KERNELS, SPLIT_FREE, invariance_method
    from clef_vllm.engine.settings import schedule_args

    # Scheduled exactly as vLLM's batch-invariant mode is: several whole prompts per step, none split.
    assert schedule_args(max_model_len=4096, method=SPLIT_FREE) == schedule_args(max_model_len=4096, method=KERNELS)
    monkeypatch.setenv(GPU_METHOD_ENV, "split-free")
    assert invariance_method(True, tiny_dir, capability=9) == SPLIT_FREE
    assert invariance_method(False, tiny_dir) != SPLIT_FREE  # a CPU keeps one prompt per step
    monkeypatch.setenv(GPU_METHOD_ENV, "vllm")
    assert invariance_method(True, tiny_dir, capability=9) == KERNELS
    monkeypatch.setenv(GPU_METHOD_ENV, "fast")
    with pytest.raises(SettingsError, match="the choices are split-free, vllm"):
        invariance_method(True, tiny_dir, capability=9)
    # The split-free method's BLAS library is checked where the engine is started, not in its processes.
    monkeypatch.setenv(GPU_METHOD_ENV, "split-free")
    monkeypatch.setenv("CLEF_SPLIT_FREE_BLAS", "cublas")
    assert invariance_method(True, tiny_dir, capability=9) == SPLIT_FREE
    monkeypatch.setenv("CLEF_SPLIT_FREE_BLAS", "hipblas")
    with pytest.raises(SettingsError, match="CLEF_SPLIT_FREE_BLAS='hipblas': the choices are cublaslt, cublas"):
        invariance_method(True, tiny_dir, capability=9)


def test_an_engine_started_split_free_gets_cublas_without_split_k_and_the_next_one_gets_the_environment_back(
    tiny_dir, monkeypatch
):
    import clef_vllm.engine.settings as engine_module
    from clef_vllm.engine.invariance import GPU_METHOD_ENV, NO_SPLIT_K_ENV, SPLIT_FREE_ENV

    monkeypatch.setenv(GPU_METHOD_ENV, "split-free")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    # As on a GPU machine: the engine module asks whether it runs on one.
    monkeypatch.setattr(engine_module, "uses_gpu", lambda: True)
    engine_module.prepare_engine_process(True, tiny_dir, {})
    assert os.environ[SPLIT_FREE_ENV] == "1" and os.environ["VLLM_BATCH_INVARIANT"] == "0"
    assert {name: os.environ[name] for name in NO_SPLIT_K_ENV} == NO_SPLIT_K_ENV
    engine_module.prepare_engine_process(False, tiny_dir, {})  # a batched engine after it
    assert os.environ[SPLIT_FREE_ENV] == "0"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and "CUBLASLT_WORKSPACE_SIZE" not in os.environ
