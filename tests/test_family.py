"""The Clef family: clef (27B) and Clef-Omni beside clef-flash. Their sizes, their tiny siblings' structure, their
quantized releases (each with its own keep-list) and their serving paths: clef-tiny through the plugin, omni-tiny
through vLLM's own ClefOmniForJointSchema. One engine per family (`clef_engine`), one server per family."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from safetensors import safe_open
from typer.testing import CliRunner

from clef_quant.cli import app
from clef_quant.families import FAMILIES, family_of_folder
from clef_quant.quantize.inspect import inspect_checkpoint
from clef_quant.quantize.recipes import keep_bf16
from clef_quant.tiny import SIZES, parameter_count
from clef_quant.tiny.backbone_config import backbone_config, meta_model, placeholder_ids

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = pytest.mark.unit(order=30)

EXAMPLE_REQUEST = Path(__file__).resolve().parents[1] / "examples" / "request.json"
# bf16 through vLLM's CPU kernels against transformers' (docs/score.md's noise floor is 0.011 on the tiny model;
# MoE routing adds its own rounding).
NOISE_FLOOR = 0.05


@pytest.fixture
def own_engine_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Omni engine runs its core in its own process: in-process engines share vLLM's process-wide parallel
    state, which the suite's first (dense) engine creates without the expert-parallel group a MoE model needs."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")


def _probabilities(response: dict[str, Any]) -> dict[str, float]:
    """Every option probability of a SystemOne response, keyed `question/option` (noul as its p_true)."""
    found: dict[str, float] = {}
    for qid, answer in response["answers"].items():
        if answer["type"] == "noul":
            found[f"{qid}/true"] = answer["noul"]
        else:
            found.update({f"{qid}/{o}": p for o, p in answer["probabilities"].items()})
    return found


def _max_gap(a: dict[str, Any], b: dict[str, Any]) -> float:
    pa, pb = _probabilities(a), _probabilities(b)
    assert pa.keys() == pb.keys()
    return max(abs(pa[k] - pb[k]) for k in pa)


# -- sizes ------------------------------------------------------------------------------------------------------


def test_clef_size_has_the_27b_shapes() -> None:
    config = backbone_config(SIZES["clef"], placeholder_ids(SIZES["clef"]))
    text = config.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        5120,
        64,
        24,
        4,
    )
    assert (text.intermediate_size, text.vocab_size) == (17408, 248320)
    assert text.layer_types.count("full_attention") == 16 and text.layer_types.count("linear_attention") == 48
    assert config.vision_config.out_hidden_size == 5120
    assert SIZES["clef"].family == "clef" and FAMILIES["clef"].hidden_size == 5120
    assert 27.4e9 < parameter_count("clef") < 27.6e9  # 55 GB in bf16, the release's size
    names = {name for name, _ in meta_model(config).named_parameters()}
    assert not any("mtp" in name for name in names)


def test_omni_size_has_the_thinker_shapes() -> None:
    config = backbone_config(SIZES["omni"], placeholder_ids(SIZES["omni"]))
    thinker = config.thinker_config
    text = thinker.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_experts, text.num_experts_per_tok) == (2048, 48, 128, 8)
    assert (text.moe_intermediate_size, text.vocab_size, text.head_dim) == (768, 152064, 128)
    assert thinker.audio_config.output_dim == thinker.vision_config.out_hidden_size == 2048
    assert config.architectures == ["Qwen3OmniMoeForConditionalGeneration"] and not config.enable_audio_output
    assert 31.5e9 < parameter_count("omni") < 32.0e9


# -- tiny siblings ----------------------------------------------------------------------------------------------


def test_clef_tiny_keeps_the_27b_structure(family_dir) -> None:
    folder = family_dir("clef-tiny")
    text = json.loads((folder / "config.json").read_text())["text_config"]
    big = SIZES["clef"].text
    assert text["layer_types"] == SIZES["tiny"].text.layer_types  # 3 Gated DeltaNet layers, then full attention
    assert (
        text["num_attention_heads"] // text["num_key_value_heads"] == big.num_attention_heads // big.num_key_value_heads
    )
    assert (
        text["linear_num_value_heads"] // text["linear_num_key_heads"]
        == big.linear_num_value_heads // big.linear_num_key_heads
    )
    assert family_of_folder(folder) is FAMILIES["clef"]
    assert sum(f.stat().st_size for f in folder.iterdir()) < 8_000_000


def test_omni_tiny_keeps_every_part_of_the_thinker(family_dir) -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    folder = family_dir("omni-tiny")
    spec = SIZES["omni-tiny"].text
    with safe_open(folder / "model.safetensors", "pt") as f:
        names = set(f.keys())
    for layer in range(spec.num_hidden_layers):
        prefix = f"thinker.model.layers.{layer}.mlp."
        assert f"{prefix}gate.weight" in names  # the router
        for expert in range(spec.num_experts):  # one Linear per expert, as released and as vLLM loads them
            assert {f"{prefix}experts.{expert}.{p}_proj.weight" for p in ("gate", "up", "down")} <= names
    assert any(n.startswith("thinker.audio_tower.") for n in names)
    assert any(n.startswith("thinker.visual.merger_list.") for n in names)  # deepstack
    assert not any(n.startswith(("talker.", "code2wav.")) for n in names)
    _, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(folder, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    assert family_of_folder(folder) is FAMILIES["clef-omni"]
    assert sum(f.stat().st_size for f in folder.iterdir()) < 8_000_000


def test_loading_for_quantize_frees_each_fused_expert_block_before_copying_the_next(family_dir) -> None:
    # A full-size Clef-Omni is 59 GiB in bf16: on an 80 GB card the experts must not exist twice at once.
    import weakref

    from llmcompressor.modeling.moe.linearize import get_non_linearized_moes

    from clef_quant.quantize import compress
    from clef_quant.quantize.compress import backbone_class

    folder = family_dir("omni-tiny")
    model = backbone_class(json.loads((folder / "config.json").read_text())).from_pretrained(folder)
    fused = [weakref.ref(module) for _name, module in get_non_linearized_moes(model)]
    assert len(fused) == SIZES["omni-tiny"].text.num_hidden_layers
    alive_when_placed: list[int] = []
    place = model.set_submodule

    def placing(name: str, module: Any, *args: Any, **kwargs: Any) -> None:
        place(name, module, *args, **kwargs)
        alive_when_placed.append(sum(ref() is not None for ref in fused))

    model.set_submodule = placing
    compress._linearize_experts(model)
    # after the k-th block is placed, only the blocks not yet copied are still in memory
    assert alive_when_placed == [len(fused) - k for k in range(1, len(fused) + 1)]
    assert not get_non_linearized_moes(model)


# -- quantize and inspect ---------------------------------------------------------------------------------------


def test_omni_fp8_quantizes_every_expert_and_keeps_its_keep_list(family_quantized) -> None:
    folder = family_quantized("omni-tiny", "fp8-dynamic")
    report = inspect_checkpoint(folder)
    assert report.ok, [str(v) for v in report.violations]
    assert report.family is FAMILIES["clef-omni"]
    schemes = {m.name: m.scheme for m in report.modules}
    experts = [name for name in schemes if ".mlp.experts." in name]
    spec = SIZES["omni-tiny"].text
    assert len(experts) == spec.num_hidden_layers * spec.num_experts * 3
    assert {schemes[name] for name in experts} == {"FP8_DYNAMIC"}
    kept = [n for n in schemes if n.startswith(("thinker.audio_tower.", "thinker.visual.")) or n == "thinker.lm_head"]
    assert kept and {schemes[n] for n in kept} == {"bf16"}
    ignore = yaml.safe_load((folder / "recipe.yaml").read_text())["default_stage"]["default_modifiers"][
        "QuantizationModifier"
    ]["ignore"]
    assert ignore == list(keep_bf16(FAMILIES["clef-omni"]))  # Omni's own keep-list, not clef-flash's
    assert r"re:.*mlp\.gate$" in ignore
    kinds = report.totals_by_kind()
    assert "audio" in kinds and "mlp.experts.gate_proj" in kinds


def test_omni_nvfp4_calibrates_every_expert(family_quantized) -> None:
    folder = family_quantized("omni-tiny", "nvfp4")
    report = inspect_checkpoint(folder)
    assert report.ok, [str(v) for v in report.violations]  # each expert's gate/up share one global scale
    scales: dict[str, float] = {}
    for shard in json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values():
        with safe_open(folder / shard, "pt") as f:
            found = [k for k in f.keys() if k.endswith("input_global_scale")]  # noqa: SIM118
            scales.update({k: f.get_tensor(k).float().item() for k in found})
    spec = SIZES["omni-tiny"].text
    expert_scales = {k: v for k, v in scales.items() if ".mlp.experts." in k}
    # An activation scale for every expert's three projections, each from calibration data that reached it.
    assert len(expert_scales) == spec.num_hidden_layers * spec.num_experts * 3
    assert all(math.isfinite(v) and v > 0 for v in expert_scales.values())


def test_clef_tiny_nvfp4a16_shares_the_qkv_z_scale(family_quantized) -> None:
    folder = family_quantized("clef-tiny", "nvfp4a16")
    report = inspect_checkpoint(folder)
    assert report.ok, [str(v) for v in report.violations]
    assert report.family is FAMILIES["clef"]
    for layer, kind in enumerate(SIZES["clef-tiny"].text.layer_types):
        if kind != "linear_attention":
            continue
        prefix = f"model.language_model.layers.{layer}.linear_attn."
        with safe_open(folder / "model.safetensors", "pt") as f:
            qkv = f.get_tensor(f"{prefix}in_proj_qkv.weight_global_scale")
            z = f.get_tensor(f"{prefix}in_proj_z.weight_global_scale")
        assert qkv.equal(z)


def test_inspect_names_the_model(family_dir) -> None:
    result = CliRunner().invoke(app, ["inspect", str(family_dir("omni-tiny")), "--json"])
    assert json.loads(result.stdout)["model"]["engine_architecture"] == "ClefOmniForJointSchema"


# -- serving --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", ["clef-tiny", "omni-tiny"])
def test_engine_matches_the_transformers_reference(
    family_dir, clef_engine, monkeypatch: pytest.MonkeyPatch, size: str
) -> None:
    from clef_quant.reference import ReferenceScorer
    from clef_vllm.format.request import parse_request

    folder = family_dir(size)
    body = json.loads(EXAMPLE_REQUEST.read_text())
    if SIZES[size].audio is not None:
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # see own_engine_process
    engine = clef_engine(folder)
    architecture = engine.llm.llm_engine.model_config.architecture
    assert architecture == FAMILIES[SIZES[size].family].engine_architecture
    (served,) = engine.score([body])
    reference = ReferenceScorer(folder).score([parse_request(body)])[0].response
    assert served["usage"] == reference["usage"]
    assert _max_gap(served, reference) < NOISE_FLOOR


def test_vllm_serve_answers_omni_natively(family_dir, clef_engine, own_engine_process, tmp_path: Path) -> None:
    """`vllm serve` on an Omni folder needs no override: vLLM's own class and its /v1/systemone read strategy
    answer as our engine does."""
    from clef_quant.bench.processes import free_port, native_vllm_command, native_vllm_env, running

    folder = family_dir("omni-tiny")
    body = json.loads(EXAMPLE_REQUEST.read_text())
    (ours,) = clef_engine(folder).score([body])
    port = free_port()
    flags = ("--served-model-name", "clef", "--max-model-len", "4096", "--enforce-eager", "--language-model-only")
    # the command `bench modes --serve-native` starts, without our plugin
    with running(native_vllm_command(folder, port, *flags), port, tmp_path / "vllm-serve.log", native_vllm_env()):
        response = httpx.post(f"http://127.0.0.1:{port}/v1/systemone", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert _max_gap(response.json(), ours) < 2e-3


def test_eval_runs_on_omni(family_dir, family_quantized, clef_engine, own_engine_process, tmp_path: Path) -> None:
    """eval's three sides on Omni: transformers, the bf16 folder through vLLM (the session's engine for it, which
    the serving tests above started), and a release whose experts are quantized too, in the one expert scheme of
    vLLM's CPU build that keeps activations quantized (fp8-block). vLLM's x86 expert kernels need AMX tiles; without
    them every quantized Omni release is refused (the test after this one)."""
    import torch
    from test_eval import SharedEngines

    if not torch.cpu._is_amx_tile_supported():
        pytest.skip("vLLM's CPU kernels for quantized experts need AMX tiles")

    from clef_quant.evaluation.config import EvalConfig
    from clef_quant.evaluation.report import write_results
    from clef_quant.evaluation.runner import run_eval

    fixtures = Path(__file__).resolve().parents[1] / "eval" / "fixtures"
    folder = family_dir("omni-tiny")
    candidate = family_quantized("omni-tiny", "fp8-block")
    assert {m.scheme for m in inspect_checkpoint(candidate).modules if ".mlp.experts." in m.name} == {"FP8_BLOCK"}
    data = tmp_path / "data"
    built = CliRunner().invoke(
        app,
        ["build-data", "--out", str(data), "--source", str(fixtures), "--per-task", "1", "--calibration", "1",
         "--tokenizer", str(folder)],
    )  # fmt: skip
    assert built.exit_code == 0, built.output
    config = EvalConfig(
        reference=str(folder),
        candidates=[str(candidate)],
        data=data,
        out=tmp_path / "results",
        max_model_len=clef_engine(folder).max_length,  # the reference encodes as the engines do
    )
    engines = SharedEngines(clef_engine, config.max_model_len, engine_kwargs={})
    run = run_eval(config, engines=engines)
    write_results(run.results, config.out)
    assert [side.role for side in run.sides] == ["reference", "noise-floor", "candidate"]
    assert len(engines.opened) == 2  # the bf16 folder (noise floor) and the candidate
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert len(results["sides"]) == 3, results["sides"]


def test_eval_refuses_omni_experts_the_cpu_cannot_run(family_dir, family_quantized, tmp_path: Path) -> None:
    """An FP8_DYNAMIC Omni release has no expert kernel in vLLM's CPU build: eval says so and what runs instead,
    before anything is scored or written."""
    folder = family_dir("omni-tiny")
    candidate = family_quantized("omni-tiny", "fp8-dynamic")
    data, out = tmp_path / "data", tmp_path / "results"
    runner = CliRunner()
    built = runner.invoke(
        app,
        ["build-data", "--out", str(data), "--source", str(Path(__file__).resolve().parents[1] / "eval" / "fixtures"),
         "--task", "boolq", "--per-task", "1", "--calibration-count", "0", "--tokenizer", str(folder)],
    )  # fmt: skip
    assert built.exit_code == 0, built.output
    result = runner.invoke(
        app, ["eval", "--reference", str(folder), "--candidate", str(candidate), "--data", str(data), "--out", str(out)]
    )
    assert result.exit_code == 2, result.output
    assert "cannot run this release's quantized experts" in result.output and "fp8-block" in result.output
    assert not out.exists()
    served = subprocess.run(
        [sys.executable, "-m", "clef_vllm.server.cli", "--model", str(candidate)], capture_output=True, text=True
    )
    assert served.returncode == 2 and "cannot run this release's quantized experts" in served.stderr, served.stderr


def test_quantized_experts_are_refused_on_an_x86_cpu_without_amx_tiles(
    family_quantized, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's x86 expert kernels (FP8 blocks and 4-bit integers) both ask for AMX tiles; without them its engine
    dies in the worker, so the plugin refuses first, on the CPU it is on (the probe stands in for two CPUs)."""
    from clef_vllm.engine.cpu import experts
    from clef_vllm.errors import CheckpointError

    candidate = family_quantized("omni-tiny", "fp8-block")
    monkeypatch.setattr(experts.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(experts, "_has_amx_tiles", lambda: False)
    with pytest.raises(CheckpointError, match="cannot run this release's quantized experts") as refused:
        experts.check_cpu_experts(candidate)
    assert "AMX" in str(refused.value)
    monkeypatch.setattr(experts, "_has_amx_tiles", lambda: True)
    experts.check_cpu_experts(candidate)


# -- experts of one MoE layer in one scheme ---------------------------------------------------------------------

ONE_EXPERT = "thinker.model.layers.0.mlp.experts.3"


def _keep_one_expert_bf16(release: Path, out: Path) -> Path:
    """`release` (FP8_DYNAMIC experts) as llm-compressor writes it with ONE_EXPERT in its ignore list: that
    expert's projections stored in bf16 (dequantized), without scales, and named in `ignore`."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(release, out)
    weights = load_file(out / "model.safetensors")
    projections = [f"{ONE_EXPERT}.{p}_proj" for p in ("gate", "up", "down")]
    for module in projections:
        scale = weights.pop(f"{module}.weight_scale").float()
        weights[f"{module}.weight"] = (weights[f"{module}.weight"].float() * scale).to(torch.bfloat16)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    index = json.loads((out / "model.safetensors.index.json").read_text())
    index["weight_map"] = {name: "model.safetensors" for name in sorted(weights)}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["ignore"] += projections
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_a_release_keeping_one_expert_of_a_layer_bf16_is_refused_on_any_device(
    family_quantized, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One ignored expert is not every expert: vLLM reads a MoE layer's scheme from its first expert and loads the
    others as that scheme, so no vLLM loads this release; the CPU check used to let it through as all bf16."""
    import clef_vllm.engine.invariance
    from clef_vllm.engine import ClefEngine
    from clef_vllm.engine.release_kernels import check_release_kernels
    from clef_vllm.errors import CheckpointError
    from clef_vllm.server.cli import main

    folder = _keep_one_expert_bf16(family_quantized("omni-tiny", "fp8-dynamic"), tmp_path / "one-expert-bf16")
    with pytest.raises(SystemExit) as exited:
        main(["--model", str(folder)])
    assert exited.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "thinker.model.layers.0.mlp.experts" in line and "3 of its 12 expert projections bf16" in line, line
    with pytest.raises(CheckpointError, match=r"experts\.3\.gate_proj"):
        ClefEngine(folder)
    monkeypatch.setattr(clef_vllm.engine.invariance, "uses_gpu", lambda: True)  # where its FP8 experts have kernels
    with pytest.raises(CheckpointError, match="no vLLM can load this release"):
        check_release_kernels(folder)


def test_quantize_refuses_a_recipe_keeping_some_experts_of_a_layer_bf16(family_dir, tmp_path: Path) -> None:
    """The plan is refused before anything is written; every expert of every layer kept bf16 is a release the CPU
    check lets through (bf16 experts run anywhere)."""
    from clef_vllm.engine.release_kernels import check_release_kernels

    keep = list(keep_bf16(FAMILIES["clef-omni"]))
    cases = {
        "one": [*keep, *(f"{ONE_EXPERT}.{p}_proj" for p in ("gate", "up", "down"))],
        "all": [*keep, r"re:.*\.mlp\.experts\..*"],
    }
    written = {}
    for name, ignore in cases.items():
        recipe = tmp_path / f"{name}.yaml"
        modifier = {"targets": ["Linear"], "ignore": ignore, "scheme": "FP8_DYNAMIC"}
        recipe.write_text(yaml.safe_dump({"default_stage": {"default_modifiers": {"QuantizationModifier": modifier}}}))
        out = tmp_path / f"omni-{name}"
        written[name] = CliRunner().invoke(
            app, ["quantize", str(family_dir("omni-tiny")), "--recipe", str(recipe), "--out", str(out)]
        )
    refused = written["one"]
    assert refused.exit_code == 2 and "Traceback" not in refused.output, refused.output
    (line,) = [line for line in refused.output.splitlines() if line.startswith("error:")]
    assert "thinker.model.layers.0.mlp.experts (3 bf16" in line and "every expert of a layer together" in line, line
    assert not (tmp_path / "omni-one").exists() and not (tmp_path / "omni-one.partial").exists()
    assert written["all"].exit_code == 0, written["all"].output
    check_release_kernels(tmp_path / "omni-all")
