"""Our quantized releases against the rules other engines use to detect a Clef model, and the same answers through
our plugin whichever layout the head has.

The rules are stated here from the engines' code, independently of `clef_quant.engines_compat` (which inspect
uses): vLLM >= 0.33 (`clef_flash.py`), SGLang 0.5.23 (`joint_schema_head.py`), llama.cpp's converter and NeMo
AutoModel's `load_joint_head` take a checkpoint for Clef when config.json's architectures name
Qwen3_5ForConditionalGeneration and both head files sit at the folder's root.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner
from workloads import short_requests

from clef_quant.cli import app
from clef_quant.engines_compat import ENGINES, detect_all, over_limits, read_request
from clef_quant.quantize.inspect import inspect_checkpoint
from clef_quant.release_folder.manifest import MANIFEST_FILE

ARCHITECTURE = "Qwen3_5ForConditionalGeneration"
ROOT_HEAD_FILES = ("joint_head_config.json", "joint_head.safetensors")
DETECT_AT_ROOT_ONLY = ("vLLM >= 0.33", "SGLang >= 0.5.23", "llama.cpp", "NeMo AutoModel")
OUR_ENGINES = ("clef-vllm", "vllm serve + clef-vllm")
# (choice options, score levels) each engine accepts: (lowest, highest), None where it sets no bound.
LIMITS = {
    "clef-vllm": ((1, 256), (1, 256)),
    "vllm serve + clef-vllm": ((1, 26), (1, 10)),
    "vLLM >= 0.33": ((None, 26), (2, 10)),
    "SGLang >= 0.5.23": ((None, 255), (None, 10)),
}
SCHEMES = ("fp8-dynamic", "nvfp4")
INDEX = "model.safetensors.index.json"
ENGINE_KWARGS = {"max_num_batched_tokens": 4096}  # as the plugin tests start theirs: one engine per folder


def legacy_copy(folder: Path, to: Path) -> Path:
    """`folder` as quantize wrote it before the root layout: the head in clef_head/, no weights index."""
    shutil.copytree(folder, to)
    (to / "clef_head").mkdir()
    for name in ROOT_HEAD_FILES:
        (to / name).rename(to / "clef_head" / name)
    (to / INDEX).unlink()
    manifest = json.loads((to / MANIFEST_FILE).read_text(encoding="utf-8"))
    files = manifest["files"]
    del files[INDEX]
    for name in ROOT_HEAD_FILES:
        files[f"clef_head/{name}"] = files.pop(name)
    (to / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return to


def tensor_names(path: Path) -> set[str]:
    with safe_open(str(path), framework="pt") as handle:
        return set(handle.keys())


def detected(folder: Path) -> dict[str, bool]:
    return {d.engine.name: d.detected for d in detect_all(folder)}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_release_meets_the_detection_rules_of_every_engine(tiny_dir: Path, quantized_dir, scheme: str) -> None:
    folder = quantized_dir(scheme)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert ARCHITECTURE in config["architectures"]
    for name in ROOT_HEAD_FILES:
        assert (folder / name).read_bytes() == (tiny_dir / name).read_bytes(), name
    assert detected(folder) == dict.fromkeys([*OUR_ENGINES, *DETECT_AT_ROOT_ONLY], True)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_weights_index_lists_only_backbone_shards(quantized_dir, scheme: str) -> None:
    """Engines read the shards the index names; the head's file beside them must not be one."""
    folder = quantized_dir(scheme)
    index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
    shards = set(index["weight_map"].values())
    assert shards == {p.name for p in folder.glob("*.safetensors")} - {"joint_head.safetensors"}
    stored = set().union(*(tensor_names(folder / shard) for shard in shards))
    assert set(index["weight_map"]) == stored
    assert not stored & tensor_names(folder / "joint_head.safetensors")
    assert index["metadata"]["total_size"] <= sum((folder / shard).stat().st_size for shard in shards)


def test_legacy_layout_is_read_by_our_plugin_only(quantized_dir, tmp_path: Path) -> None:
    legacy = legacy_copy(quantized_dir("fp8-dynamic"), tmp_path / "legacy")
    found = detected(legacy)
    assert {name: found[name] for name in OUR_ENGINES} == dict.fromkeys(OUR_ENGINES, True)
    assert {name: found[name] for name in DETECT_AT_ROOT_ONLY} == dict.fromkeys(DETECT_AT_ROOT_ONLY, False)
    report = inspect_checkpoint(legacy)
    assert report.ok, report.violations
    assert any("clef_head/" in note and "quantize again" in note for note in report.notes)


def test_engine_limits_are_the_engines_own(tiny_dir: Path) -> None:
    engines = {engine.name: engine for engine in ENGINES if engine.serves}
    assert set(engines) == set(LIMITS)
    for name, ((choice_low, choice_high), (score_low, score_high)) in LIMITS.items():
        for count in (1, 2, 10, 11, 26, 27, 255, 256, 257):
            choice = {"c": {"type": "choice", "criteria": {f"o{i}": None for i in range(count)}}}
            score = {"s": {"type": "score", "criteria": [f"level {i}" for i in range(count)]}}
            for questions, low, high in ((choice, choice_low, choice_high), (score, score_low, score_high)):
                request = read_request({"state": "s", "questions": questions})
                allowed = (low is None or count >= low) and (high is None or count <= high)
                assert bool(over_limits(request, engines[name])) is not allowed, (name, questions.keys(), count)


def test_inspect_engines_names_what_each_engine_refuses(quantized_dir, tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    questions = {
        "team": {"type": "choice", "criteria": {f"t{i}": f"team {i}" for i in range(30)}},
        "urgent": {"type": "noul"},
    }
    request.write_text(json.dumps({"state": "a ticket", "questions": questions}), encoding="utf-8")
    runner = CliRunner()
    args = ["inspect", str(quantized_dir("fp8-dynamic")), "--request", str(request)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["engine"]: row for row in json.loads(result.output)["engines"]}
    assert all(row["detects"] for row in rows.values())
    assert rows["clef-vllm"]["refuses"] == rows["SGLang >= 0.5.23"]["refuses"] == []
    expected = ['question "team": choice with 30 options (allowed <= 26)']
    assert rows["vLLM >= 0.33"]["refuses"] == expected
    table = runner.invoke(app, args, env={"COLUMNS": "250"})
    assert table.exit_code == 0 and 'question "team": choice with 30 options' in table.output
    assert "engines: which detect a Clef model" in table.output

    request.write_text(json.dumps({"state": "s", "questions": {"q": {"type": "box"}}}), encoding="utf-8")
    bad = runner.invoke(app, args)
    assert bad.exit_code == 2 and bad.output.count("error:") == 1 and "Traceback" not in bad.output


def test_inspect_engines_says_what_a_legacy_release_misses(quantized_dir, tmp_path: Path) -> None:
    legacy = legacy_copy(quantized_dir("fp8-dynamic"), tmp_path / "legacy")
    result = CliRunner().invoke(app, ["inspect", str(legacy), "--engines", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["engine"]: row for row in json.loads(result.output)["engines"]}
    assert rows["vLLM >= 0.33"]["missing"] == ["joint_head.safetensors and joint_head_config.json at the root"]
    assert rows["clef-vllm"]["missing"] == []


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
def test_answers_are_bit_identical_in_both_layouts(quantized_dir, clef_engine, tmp_path: Path, scheme: str) -> None:
    folder = quantized_dir(scheme)
    bodies = short_requests(8)
    root = clef_engine(folder, **ENGINE_KWARGS)
    encodings = [root.encode(body)[1] for body in bodies]
    expected = root.logits(encodings)
    legacy = clef_engine(legacy_copy(folder, tmp_path / "legacy"), **ENGINE_KWARGS).logits(encodings)
    assert all(torch.equal(a, b) for a, b in zip(expected, legacy, strict=True))


@pytest.mark.slow
def test_head_tensors_beside_an_unindexed_backbone_are_not_loaded_as_weights(
    quantized_dir, clef_engine, tmp_path: Path
) -> None:
    """Without an index vLLM streams joint_head.safetensors with the backbone; the model must pass over it."""
    folder = quantized_dir("fp8-dynamic")
    unindexed = tmp_path / "unindexed"
    shutil.copytree(folder, unindexed)
    (unindexed / INDEX).unlink()
    bodies = short_requests(4)
    root = clef_engine(folder, **ENGINE_KWARGS)
    encodings = [root.encode(body)[1] for body in bodies]
    expected = root.logits(encodings)
    answers = clef_engine(unindexed, **ENGINE_KWARGS).logits(encodings)
    assert all(torch.equal(a, b) for a, b in zip(expected, answers, strict=True))


def test_card_facts_read_both_layouts(quantized_dir, tmp_path: Path) -> None:
    from clef_quant.publish import folder_facts
    from clef_quant.release_folder.manifest import read_manifest

    root = quantized_dir("fp8-dynamic")
    legacy = legacy_copy(root, tmp_path / "legacy")
    facts = {}
    for name, folder in (("root", root), ("legacy", legacy)):
        manifest = read_manifest(folder)
        assert manifest is not None
        files = manifest.files
        kinds = {file: folder_facts.file_kind(file) for file in files if "joint_head" in file}
        facts[name] = (folder_facts.head_summary(folder), folder_facts.head_bytes(files), sorted(kinds.values()))
        assert folder_facts.backbone_bytes(files) == (folder / "model.safetensors").stat().st_size
    assert facts["root"] == facts["legacy"]
    assert facts["root"][1] == sum((root / name).stat().st_size for name in ROOT_HEAD_FILES)
    assert facts["root"][2] == ["head_config", "head_weights"]
