"""`clef-quant quantize` / `inspect` on the tiny release: real llm-compressor runs, real compressed-tensors folders.

Error bounds were measured on the tiny checkpoint (relative Frobenius error of each dequantized weight against its
bf16 source, 25 quantized modules per scheme): FP8_DYNAMIC 0.0258-0.0267, NVFP4 and NVFP4A16 0.0946-0.0958 (the
hybrid: the same per half). The windows below fail a skipped layer (error 0) and a wrong scale (0.9x already
gives 0.10 for FP8 and 0.14 for NVFP4; the 0.67x of a split qkv/z scale gives ~0.33).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from clef_quant.cli import app
from clef_quant.quantize.calibration import (
    DEFAULT_CALIBRATION_FILE,
    as_dataloader,
    build_calibration,
    read_request_bodies,
)
from clef_quant.quantize.contents import PASSENGER_FILES
from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.fused_scales import QKVZ_GROUP, fused_global_scales
from clef_quant.quantize.inspect import inspect_checkpoint
from clef_quant.quantize.inspect_report import CHECK_FUSED, CHECK_HEAD, CHECK_KEEP, CHECK_MANIFEST
from clef_quant.quantize.recipes import fill, is_kept_bf16, layer_variables, load_recipe, matches_target
from clef_quant.release_folder.manifest import MANIFEST_FILE, sha256_file, verify_manifest
from clef_quant.release_folder.versions import RELEASE_TOOLS

# The round-to-nearest schemes; the others (GPTQ, AWQ, MSE, FP8 block, W4A16) are in test_quality.py.
SCHEME_LIST = ["fp8-dynamic", "nvfp4", "nvfp4-hybrid", "nvfp4a16"]
# (lower, upper) relative Frobenius error of a dequantized weight, per compressed-tensors scheme.
ERROR_WINDOWS = {"FP8_DYNAMIC": (0.02, 0.032), "NVFP4": (0.085, 0.105), "NVFP4A16": (0.085, 0.105)}
WRONG_SCALE = 0.67  # what a qkv weight looks like when vLLM applies the z scale to it (stack notes)
HEAD_FILES = ("joint_head.safetensors", "joint_head_config.json")
TINY_LAYERS = 4


def expected_scheme(scheme: str, name: str) -> str:
    """What each Linear module of the tiny release must become under a built-in scheme."""
    if is_kept_bf16(name):
        return "bf16"
    if scheme == "nvfp4-hybrid":
        layer = int(name.split(".layers.")[1].split(".")[0])
        return "FP8_DYNAMIC" if layer < TINY_LAYERS // 2 else "NVFP4"
    return {"fp8-dynamic": "FP8_DYNAMIC", "nvfp4": "NVFP4", "nvfp4a16": "NVFP4A16"}[scheme]


def relative_error(reference: torch.Tensor, other: torch.Tensor) -> float:
    reference, other = reference.detach().float(), other.detach().float()
    return float((reference - other).norm() / reference.norm())


def load_backbone(folder: Path) -> torch.nn.Module:
    """A release in transformers; compressed-tensors folders are decompressed to dense bf16 weights on load."""
    from transformers import Qwen3_5ForConditionalGeneration
    from transformers.utils.quantization_config import CompressedTensorsConfig

    kwargs = {}
    if "quantization_config" in json.loads((folder / "config.json").read_text()):
        kwargs["quantization_config"] = CompressedTensorsConfig(run_compressed=False)
    return Qwen3_5ForConditionalGeneration.from_pretrained(folder, dtype=torch.bfloat16, **kwargs)


def copy_release(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


def cli(*args: str) -> object:
    return CliRunner().invoke(app, list(args))


def plain_llm_compressor(tiny_dir: Path, out: Path, scheme: str, ignore: list[str]) -> Path:
    """A compressed-tensors folder made by llm-compressor alone (no clef-quant: no fused qkv/z, no manifest)."""
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoTokenizer

    model = load_backbone(tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    kwargs = {}
    if scheme == "NVFP4":
        ids = [torch.randint(0, 2000, (1, 48), generator=torch.Generator().manual_seed(i)) for i in range(2)]
        data = torch.utils.data.DataLoader(
            ids, batch_size=None, collate_fn=lambda x: {"input_ids": x, "attention_mask": torch.ones_like(x)}
        )
        kwargs = {"dataset": data, "processor": tokenizer}
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore), **kwargs)
    model.save_pretrained(out, save_compressed=True)
    return out


# -- each scheme ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEME_LIST)
def test_each_scheme_quantizes_and_inspect_passes(quantized_dir, scheme: str) -> None:
    report = inspect_checkpoint(quantized_dir(scheme))
    assert report.ok, [str(v) for v in report.violations]
    assert {c.name: c.status for c in report.checks} == dict.fromkeys([c.name for c in report.checks], "pass")
    got = {m.name: m.scheme for m in report.modules}
    assert got == {name: expected_scheme(scheme, name) for name in got}
    assert {m.name for m in report.modules if m.scheme == "bf16"} == {m.name for m in report.modules if not m.quantized}
    assert len(report.modules) == 42  # 25 decoder Linear + 6 DeltaNet gates + 10 vision + lm_head
    assert sum(m.quantized for m in report.modules) == 25


@pytest.mark.parametrize("scheme", SCHEME_LIST)
def test_weights_dequantize_close_to_the_source(tiny_dir: Path, quantized_dir, scheme: str) -> None:
    source, restored = load_backbone(tiny_dir), load_backbone(quantized_dir(scheme))
    restored_params = dict(restored.named_parameters())
    errors: dict[str, float] = {}
    for name, module in source.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        label = expected_scheme(scheme, name)
        weight = restored_params[f"{name}.weight"]
        if label == "bf16":
            assert torch.equal(weight, module.weight), f"{name} must be bit-identical"
            continue
        errors[name] = relative_error(module.weight, weight)
        low, high = ERROR_WINDOWS[label]
        assert low < errors[name] < high, f"{name} ({label}): relative error {errors[name]:.4f}"
        # The window is tight enough that a mis-scaled weight cannot hide in it.
        assert relative_error(module.weight, weight * WRONG_SCALE) > high
    assert len(errors) == 25
    # Everything that is not a Linear weight (embeddings, norms, convolutions, DeltaNet A/dt) is untouched.
    linear_weights = {f"{n}.weight" for n, m in source.named_modules() if isinstance(m, torch.nn.Linear)}
    for name, param in source.named_parameters():
        if name not in linear_weights:
            assert torch.equal(param, restored_params[name]), name


@pytest.mark.parametrize("scheme", ["nvfp4", "nvfp4a16", "nvfp4-hybrid"])
def test_qkv_and_z_share_one_global_scale(quantized_dir, scheme: str) -> None:
    from safetensors import safe_open

    folder = quantized_dir(scheme)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        keys = set(handle.keys())
        pairs = 0
        for layer in range(TINY_LAYERS):
            prefix = f"model.language_model.layers.{layer}.linear_attn"
            if f"{prefix}.in_proj_qkv.weight_global_scale" not in keys:
                continue
            qkv = handle.get_tensor(f"{prefix}.in_proj_qkv.weight_global_scale")
            z = handle.get_tensor(f"{prefix}.in_proj_z.weight_global_scale")
            assert torch.equal(qkv, z), prefix
            pairs += 1
    assert pairs == (1 if scheme == "nvfp4-hybrid" else 3)  # layers 0-2 are DeltaNet; hybrid: only 2 is NVFP4


def test_release_files_are_copied_byte_identical(tiny_dir: Path, quantized_dir) -> None:
    for scheme in ("fp8-dynamic", "nvfp4"):
        folder = quantized_dir(scheme)
        for name in HEAD_FILES:
            assert sha256_file(folder / name) == sha256_file(tiny_dir / name)  # at the root, where engines look
        assert not (folder / "clef_head").exists()
        copied = [name for name in PASSENGER_FILES if (tiny_dir / name).is_file()]
        assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "processor_config.json"} <= set(
            copied
        )
        for name in copied:
            assert sha256_file(folder / name) == sha256_file(tiny_dir / name), name
        assert (folder / "recipe.yaml").is_file()


def test_joint_schema_model_is_copied_unchanged_and_never_run(tiny_dir: Path, tmp_path: Path) -> None:
    source = copy_release(tiny_dir, tmp_path / "release")
    # If clef-quant imported or executed this file, the run would stop here.
    (source / "joint_schema_model.py").write_text("raise SystemExit('executed joint_schema_model.py')\n")
    result = cli("quantize", str(source), "--scheme", "fp8-dynamic", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "joint_schema_model.py").read_bytes() == (source / "joint_schema_model.py").read_bytes()
    assert inspect_checkpoint(tmp_path / "out").ok


@pytest.mark.parametrize("scheme", ["fp8-dynamic", "nvfp4"])
def test_manifest_records_source_recipe_tools_calibration_and_hashes(
    tiny_dir: Path, quantized_dir, scheme: str
) -> None:
    folder = quantized_dir(scheme)
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    assert manifest["scheme"] == scheme
    assert manifest["source"] == {"id": str(tiny_dir), "revision": None, "local": True}
    # The recipe llm-compressor ran, as it was given: the recipe file's front matter is not part of it.
    source_config = json.loads((tiny_dir / "config.json").read_text())
    assert manifest["recipe"]["text"] == load_recipe(scheme, None, source_config).text
    assert "clef:" not in manifest["recipe"]["text"] and "default_stage" in yaml.safe_load(manifest["recipe"]["text"])
    assert set(manifest["tools"]) == set(RELEASE_TOOLS) and all(manifest["tools"].values())
    files = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} - {MANIFEST_FILE}
    assert set(manifest["files"]) == files
    assert verify_manifest(folder) == []
    calibration = manifest["calibration"]
    if scheme == "nvfp4":
        assert calibration["records"] == 4 and calibration["tokens"] > 4 * 100
        assert calibration["source"] == "default:eval/calibration/default.jsonl"
        assert calibration["sha256"] == sha256_file(DEFAULT_CALIBRATION_FILE)
    else:
        assert calibration["records"] == 0 and calibration["source"] is None
    assert manifest["run"]["seconds"]["quantize"] > 0 and manifest["run"]["peak_host_bytes"] > 0


def test_hybrid_recipe_is_filled_for_the_checkpoint(quantized_dir) -> None:
    manifest = json.loads((quantized_dir("nvfp4-hybrid") / MANIFEST_FILE).read_text())
    text = manifest["recipe"]["text"]
    assert "{{" not in text and r"layers\.(?:0|1)\." in text and r"layers\.(?:2|3)\." in text


# -- inspect catches what must not ship -------------------------------------------------------------------------


def test_unequal_qkv_z_scales_fail_naming_the_layer(quantized_dir, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = copy_release(quantized_dir("nvfp4"), tmp_path / "bad")
    tensors = load_file(folder / "model.safetensors")
    tensors["model.language_model.layers.1.linear_attn.in_proj_z.weight_global_scale"] *= 0.5
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})

    report = inspect_checkpoint(folder)
    fused = [v for v in report.violations if v.check == CHECK_FUSED]
    assert [v.subject for v in fused] == ["model.language_model.layers.1.linear_attn"]
    assert "weight_global_scale" in fused[0].message
    result = cli("inspect", str(folder))
    assert result.exit_code == 1
    assert "model.language_model.layers.1.linear_attn" in result.output.replace("\n", "")


def test_plain_llm_compressor_nvfp4_splits_qkv_z_scales(tiny_dir: Path, tmp_path: Path) -> None:
    """Without clef-quant's fused group, llm-compressor gives qkv and z their own scales: inspect says where."""
    folder = plain_llm_compressor(
        tiny_dir, tmp_path / "plain", "NVFP4", ["lm_head", r"re:model\.visual\..*", r"re:.*in_proj_[ab]$"]
    )
    report = inspect_checkpoint(folder)
    fused = sorted(v.subject for v in report.violations if v.check == CHECK_FUSED)
    assert fused == [f"model.language_model.layers.{i}.linear_attn" for i in range(3)]
    # Quantized but without a manifest: that fails too, and the other checks still say what they found.
    assert [(v.subject, v.message.split(":")[0]) for v in report.violations if v.check == CHECK_MANIFEST] == [
        (MANIFEST_FILE, "missing")
    ]
    assert {c.name: c.status for c in report.checks}[CHECK_MANIFEST] == "fail"


def test_quantized_lm_head_fails(tiny_dir: Path, tmp_path: Path) -> None:
    folder = plain_llm_compressor(
        tiny_dir, tmp_path / "lm_head", "FP8_DYNAMIC", [r"re:model\.visual\..*", r"re:.*in_proj_[ab]$"]
    )
    report = inspect_checkpoint(folder)
    keep = [v for v in report.violations if v.check == CHECK_KEEP]
    assert [v.subject for v in keep] == ["lm_head"]
    assert {v.check for v in report.violations} == {CHECK_KEEP, CHECK_HEAD, CHECK_MANIFEST}  # no head copied either
    result = cli("inspect", str(folder))
    assert result.exit_code == 1 and "lm_head" in result.output


def test_tampered_head_file_fails_on_its_hash(quantized_dir, tmp_path: Path) -> None:
    folder = copy_release(quantized_dir("fp8-dynamic"), tmp_path / "tampered")
    head = folder / "joint_head.safetensors"
    data = bytearray(head.read_bytes())
    data[-1] ^= 0x01
    head.write_bytes(bytes(data))
    report = inspect_checkpoint(folder)
    assert [(v.check, v.subject, v.message) for v in report.violations] == [
        (CHECK_MANIFEST, "joint_head.safetensors", "sha256 mismatch")
    ]
    result = cli("inspect", str(folder))
    assert result.exit_code == 1 and "joint_head.safetensors: sha256 mismatch" in result.output


def test_missing_head_fails(quantized_dir, tmp_path: Path) -> None:
    folder = copy_release(quantized_dir("fp8-dynamic"), tmp_path / "headless")
    for name in HEAD_FILES:
        (folder / name).unlink()
    subjects = {(v.check, v.subject) for v in inspect_checkpoint(folder).violations}
    assert (CHECK_HEAD, "joint_head.safetensors") in subjects
    assert (CHECK_MANIFEST, "joint_head.safetensors") in subjects


def test_inspect_cli_lists_every_linear_module(quantized_dir) -> None:
    result = cli("inspect", str(quantized_dir("nvfp4-hybrid")))  # stdout is not a terminal here, as in `> file`
    assert result.exit_code == 0, result.output
    assert "…" not in result.output  # no cell cut to 80 columns
    assert "model.language_model.layers.3.self_attn.q_proj" in result.output
    assert "totals by kind" in result.output and "all checks passed" in result.output
    as_json = json.loads(cli("inspect", "--json", str(quantized_dir("nvfp4-hybrid"))).output)
    assert as_json["ok"] and len(as_json["modules"]) == 42


# -- quantize refuses what must not happen, before the slow part ------------------------------------------------


def test_recipe_that_quantizes_lm_head_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "greedy.yaml"
    recipe.write_text(
        "default_stage:\n  default_modifiers:\n    QuantizationModifier:\n"
        "      targets: [Linear]\n      scheme: FP8_DYNAMIC\n      ignore: ['re:model\\.visual\\..*']\n"
    )
    result = cli("quantize", str(tiny_dir), "--recipe", str(recipe), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "lm_head" in result.output and "must stay bf16" in result.output and "in_proj_a" in result.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scheme", "int3"], "unknown scheme 'int3'"),
        (["--scheme", "fp8-dynamic", "--device", "tpu"], "--device must be cpu or cuda"),
        ([], "give --scheme or --recipe"),
        (["--scheme", "nvfp4", "--calibration", "missing.jsonl"], "cannot read calibration file"),
        (["--scheme", "nvfp4", "--calibration-records", "0"], "--calibration-records must be at least 1"),
    ],
)
def test_bad_options_exit_2_with_one_line(tiny_dir: Path, tmp_path: Path, args: list[str], message: str) -> None:
    result = cli("quantize", str(tiny_dir), "--out", str(tmp_path / "out"), *args)
    assert result.exit_code == 2
    first = result.output.strip().splitlines()[0]
    assert first.startswith("error: ") and message in first
    assert "Traceback" not in result.output


def test_missing_source_exits_2_with_one_line(tmp_path: Path) -> None:
    result = cli("quantize", str(tmp_path / "nope"), "--scheme", "fp8-dynamic", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: {tmp_path / 'nope'} does not exist and is not a Hub id (ORG/NAME)"
    ]


def test_broken_calibration_file_names_its_lines(tiny_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "cal.jsonl"
    good = DEFAULT_CALIBRATION_FILE.read_text().splitlines()[0]
    data.write_text("\n".join([good, "{not json", '{"model": "m", "state": 1, "questions": {}}']) + "\n")
    result = cli(
        "quantize", str(tiny_dir), "--scheme", "nvfp4", "--calibration", str(data), "--out", str(tmp_path / "o")
    )
    assert result.exit_code == 2
    assert "2 invalid record(s): line 2 is not valid JSON: " in result.output and "line 3: questions" in result.output


def test_calibration_file_that_is_not_text_is_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "cal.jsonl"
    data.write_bytes(b"\xff\xfe not utf-8\n")
    result = cli(
        "quantize", str(tiny_dir), "--scheme", "nvfp4", "--calibration", str(data), "--out", str(tmp_path / "o")
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"calibration file {data} is not valid UTF-8 at byte 0" in result.output
    assert not (tmp_path / "o").exists()


def test_existing_output_is_refused_without_overwrite(tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = cli("quantize", str(tiny_dir), "--scheme", "fp8-dynamic", "--out", str(out))
    assert result.exit_code == 2 and "already exists; pass --overwrite" in result.output
    assert (out / "keep.txt").read_text() == "mine"

    # --overwrite replaces a release, never a folder of something else.
    result = cli("quantize", str(tiny_dir), "--scheme", "fp8-dynamic", "--out", str(out), "--overwrite")
    assert result.exit_code == 2 and "is not a quantized release (it has no clef_quant.json)" in result.output
    assert (out / "keep.txt").read_text() == "mine"

    (out / "keep.txt").unlink()
    result = cli("quantize", str(tiny_dir), "--scheme", "fp8-dynamic", "--out", str(out), "--overwrite")
    assert result.exit_code == 0, result.output
    assert inspect_checkpoint(out).ok
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no .partial or .old left behind


def test_output_inside_or_equal_to_the_source_is_refused(tiny_dir: Path) -> None:
    result = cli("quantize", str(tiny_dir), "--scheme", "fp8-dynamic", "--out", str(tiny_dir), "--overwrite")
    assert result.exit_code == 2 and "would replace the source" in result.output


# -- the pieces -------------------------------------------------------------------------------------------------


def test_fused_group_is_added_for_the_run_and_restored() -> None:
    from llmcompressor.observers import helpers

    before = list(helpers.FUSED_LAYER_NAMES)
    with pytest.raises(RuntimeError), fused_global_scales() as live:
        assert live is helpers.FUSED_LAYER_NAMES and QKVZ_GROUP in helpers.FUSED_LAYER_NAMES
        raise RuntimeError("calibration failed")
    assert before == helpers.FUSED_LAYER_NAMES and QKVZ_GROUP not in before


def test_hybrid_placeholders_split_the_layers_in_half() -> None:
    variables = layer_variables({"text_config": {"num_hidden_layers": 32}})
    assert variables["first_half_layers"] == "|".join(map(str, range(16)))
    assert variables["second_half_layers"] == "|".join(map(str, range(16, 32)))
    recipe = load_recipe("nvfp4-hybrid", None, {"text_config": {"num_hidden_layers": 32}})
    assert r"layers\.(?:0|1|2|3|4|5|6|7|8|9|10|11|12|13|14|15)\." in recipe.text
    with pytest.raises(QuantizeError, match=r"placeholder.*layer_count unknown"):
        fill("x: {{ layer_count }}", variables)
    with pytest.raises(QuantizeError, match=r"^recipe template error on line 2: "):
        fill("x: 1\ny: {{ num_layers\n", variables)
    assert fill("n: {{ num_layers }}\n", variables) == "n: 32\n"  # the final newline is the file's, kept


def test_hybrid_targets_match_transformers_and_vllm_names() -> None:
    """The patterns are saved verbatim into config.json and vLLM matches them against its own module names."""
    from compressed_tensors.quantization import QuantizationScheme

    from clef_quant.quantize.plan import parse_recipe

    recipe = load_recipe("nvfp4-hybrid", None, {"text_config": {"num_hidden_layers": 32}})
    (modifier,) = parse_recipe(recipe.text).modifiers
    groups: dict[str, QuantizationScheme] = modifier.resolved_config.config_groups
    targets = {"FP8_DYNAMIC" if g.input_activations.dynamic is True else "NVFP4": g.targets[0] for g in groups.values()}
    for layer, wanted in ((0, "FP8_DYNAMIC"), (15, "FP8_DYNAMIC"), (16, "NVFP4"), (31, "NVFP4")):
        for prefix in ("model.language_model.layers", "language_model.model.layers"):  # transformers, vLLM
            for leaf in ("linear_attn.in_proj_qkv", "self_attn.q_proj", "mlp.down_proj"):
                name = f"{prefix}.{layer}.{leaf}"
                assert [s for s, t in targets.items() if matches_target(name, t)] == [wanted], name
    assert not any(matches_target("model.language_model.layers.3.linear_attn.conv1d", t) for t in targets.values())


def test_calibration_feeds_exactly_the_serving_encoding(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    from clef_vllm.format.encoding import encode_request
    from clef_vllm.format.request import parse_request

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    calibration = build_calibration(tokenizer, records=40, max_seq_len=450)
    bodies = [json.loads(line) for line in DEFAULT_CALIBRATION_FILE.read_text().splitlines()]
    expected = [encode_request(parse_request(b), tokenizer, max_length=450).input_ids for b in bodies]
    assert calibration.input_ids == expected
    assert calibration.summary.truncated > 0 and calibration.summary.tokens == sum(map(len, expected))
    batches = list(as_dataloader(calibration))
    assert [b["input_ids"][0].tolist() for b in batches] == expected
    assert all(b["attention_mask"].all() for b in batches)


def test_calibration_file_may_wrap_requests_as_eval_records(tmp_path: Path) -> None:
    bodies = [json.loads(line) for line in DEFAULT_CALIBRATION_FILE.read_text().splitlines()[:3]]
    data = tmp_path / "eval.jsonl"
    data.write_text("\n".join(json.dumps({"id": b["id"], "request": b, "target": {}}) for b in bodies) + "\n\n")
    assert read_request_bodies(data) == bodies


def test_default_calibration_file_covers_all_question_types() -> None:
    bodies = [json.loads(line) for line in DEFAULT_CALIBRATION_FILE.read_text().splitlines()]
    types = {q["type"] for body in bodies for q in body["questions"].values()}
    assert len(bodies) >= 30 and types == {"noul", "choice", "score"}
