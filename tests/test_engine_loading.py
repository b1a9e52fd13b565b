"""What each engine we do not run makes of our quantized releases' weights (`quantize/engines_loading.py`): every
scheme quantize writes loads as stored in vLLM 0.32 under clef-vllm, vLLM 0.33/0.34 and SGLang 0.5.23, and each
loading rule, met by a release laid out otherwise, turns the verdict it governs. The vLLM rows' decisions are held
to vLLM 0.32's own matching code (installed here), and two refusals to vLLM 0.32's loader itself."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from clef_quant.engines_loading_rules import RULES
from clef_quant.quantize.engines_loading import (
    HEAD,
    Verdict,
    check_folder,
    check_layout,
    decide,
    engine_layers,
    engine_name,
    read_layout,
)
from clef_quant.quantize.registry import schemes
from clef_quant.quantize.release_files import backbone_weight_files

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = pytest.mark.unit(order=170)

VLLM = ("clef-vllm", "vllm serve + clef-vllm", "vLLM >= 0.33")
SGLANG = "SGLang >= 0.5.23"
NOT_READ = ("llama.cpp", "NeMo AutoModel")
LAYER0 = "model.language_model.layers.0.linear_attn."
SCHEMES = schemes().names
RULES_OF = {name: rules for rules in RULES for name in rules.engines}

Edit = Callable[[dict[str, Any]], None] | None


def verdicts(folder: Path) -> dict[str, Verdict | None]:
    return {check.engine: check.verdict for check in check_folder(folder)}


def expected(vllm: Verdict, sglang: Verdict) -> dict[str, Verdict | None]:
    return {**dict.fromkeys(VLLM, vllm), SGLANG: sglang, **dict.fromkeys(NOT_READ, None)}


def laid_out(folder: Path, to: Path, config: Edit = None, tensors: Edit = None) -> Path:
    """A copy of `folder` with its quantization_config and its shards' tensors edited in place."""
    shutil.copytree(folder, to)
    if config is not None:
        data = json.loads((to / "config.json").read_text(encoding="utf-8"))
        config(data["quantization_config"])
        (to / "config.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    for shard in backbone_weight_files(to) if tensors is not None else ():
        stored = load_file(shard)
        tensors(stored)
        save_file(stored, shard, metadata={"format": "pt"})
    return to


def is_ba(entry: str) -> bool:
    return re.search(r"linear_attn\.in_proj_[ab]$", entry) is not None


def drop_ignored(which: Callable[[str], bool]) -> Edit:
    return lambda q: q.update(ignore=[e for e in q["ignore"] if not which(e)])


def ba_entries(*entries: str) -> Edit:
    """The ignore list with every in_proj_a/in_proj_b entry replaced by `entries`."""
    return lambda q: q.update(ignore=[e for e in q["ignore"] if not is_ba(e)] + list(entries))


def respelled(old: str, new: str) -> Edit:
    return lambda q: q.update(ignore=[new + e[len(old) :] if e.startswith(old) else e for e in q["ignore"]])


def ba_untargeted(q: dict[str, Any]) -> None:
    """Every Linear but in_proj_a/in_proj_b (and their fused layer) targeted by name; those two not ignored."""
    names = "q_proj|k_proj|v_proj|o_proj|qkv_proj|gate_proj|up_proj|down_proj|gate_up_proj|in_proj_qkv|in_proj_z"
    for group in q["config_groups"].values():
        group["targets"] = [rf"re:.*\.(?:{names}|in_proj_qkvz|out_proj)$"]
    q["ignore"] = [e for e in q["ignore"] if not is_ba(e)]


def z_scale_doubled(stored: dict[str, Any]) -> None:
    stored[LAYER0 + "in_proj_z.weight_global_scale"] = stored[LAYER0 + "in_proj_z.weight_global_scale"] * 2


def vision_fp8(stored: dict[str, Any]) -> None:
    """The vision tower's Linear weights stored as FP8 with per-row scales, as FP8_DYNAMIC stores a Linear."""
    for name in [n for n in stored if n.startswith("model.visual.") and n.endswith(".weight")]:
        weight = stored[name]
        if weight.dim() == 2 and "embed" not in name:
            stored[name] = weight.to(torch.float8_e4m3fn)
            stored[name[: -len("weight")] + "weight_scale"] = torch.ones(weight.shape[0], 1, dtype=torch.bfloat16)


# Per rule of engines_loading_rules.LoadRules: a release laid out so that the rule decides, on the scheme it starts
# from, and the verdicts (vLLM rows, SGLang) it must then get.
BROKEN: dict[str, tuple[str, Edit, Edit, dict[str, Verdict | None]]] = {
    # mixed_members
    "in_proj_a of one layer unlisted": (
        "nvfp4", drop_ignored(lambda e: e == LAYER0 + "in_proj_a"), None, expected(Verdict.REFUSES, Verdict.REFUSES)
    ),
    # stored_unread (vLLM issue 40252's shape: the bf16 members missing from the ignore list)
    "in_proj_a and in_proj_b unlisted": (
        "nvfp4", drop_ignored(is_ba), None, expected(Verdict.REFUSES, Verdict.MISREADS)
    ),
    # renames: vLLM renames dotted entries to its own spelling, SGLang keeps the checkpoint's
    "ignore entries in vLLM's spelling": (
        "nvfp4",
        respelled("model.language_model.", "language_model.model."),
        None,
        expected(Verdict.LOADS, Verdict.MISREADS),
    ),
    "an ignore pattern in the checkpoint's spelling": (
        "nvfp4",
        ba_entries(r"re:model\.language_model\.layers\.\d+\.linear_attn\.in_proj_[ab]$"),
        None,
        expected(Verdict.REFUSES, Verdict.LOADS),
    ),
    # ignore_suffix
    "ignore entries as module suffixes": (
        "nvfp4",
        ba_entries("linear_attn.in_proj_a", "linear_attn.in_proj_b"),
        None,
        expected(Verdict.REFUSES, Verdict.LOADS),
    ),
    # fused_ignore_literal_only
    "one pattern naming in_proj_ba": (
        "nvfp4", ba_entries(r"re:.*linear_attn\.in_proj_ba$"), None, expected(Verdict.LOADS, Verdict.MISREADS)
    ),
    # no_target
    "in_proj_ba neither ignored nor targeted": (
        "fp8-dynamic", ba_untargeted, None, expected(Verdict.LOADS, Verdict.REFUSES)
    ),
    # unequal_scales, unequal_scales_weight_only
    "in_proj_qkv and in_proj_z global scales differ, NVFP4": (
        "nvfp4", None, z_scale_doubled, expected(Verdict.MISREADS, Verdict.MISREADS)
    ),
    "in_proj_qkv and in_proj_z global scales differ, NVFP4A16": (
        "nvfp4a16", None, z_scale_doubled, expected(Verdict.MISREADS, Verdict.REFUSES)
    ),
    # built_unquantized
    "vision tower in FP8": (
        "fp8-dynamic",
        drop_ignored(lambda e: e.startswith("model.visual.")),
        vision_fp8,
        expected(Verdict.LOADS, Verdict.MISREADS),
    ),
}  # fmt: skip


def broken_release(quantized_dir: Any, tmp_path: Path, case: str) -> Path:
    scheme, config, tensors, _ = BROKEN[case]
    return laid_out(quantized_dir(scheme), tmp_path / "broken", config, tensors)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_loads_as_stored_in_every_engine_read(quantized_dir: Any, scheme: str) -> None:
    folder = quantized_dir(scheme)
    assert verdicts(folder) == expected(Verdict.LOADS, Verdict.LOADS)
    layout = read_layout(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    deltanets = config["text_config"]["layer_types"].count("linear_attention")
    for rules in RULES:  # the DeltaNet's fused layers were read, each from both of its members
        layers = engine_layers(rules, layout)
        for fused, how in (("in_proj_ba", "ignored"), ("in_proj_qkvz", "quantized")):
            found = [layer for layer in layers if layer.endswith(f".linear_attn.{fused}")]
            assert len(found) == deltanets and all(len(layers[layer]) == 2 for layer in found), (rules.read, fused)
            assert {decide(layout, rules, layer).how for layer in found} == {how}, (rules.read, fused)


@pytest.mark.parametrize("case", BROKEN)
def test_each_rule_turns_the_verdict_of_a_release_laid_out_otherwise(
    quantized_dir: Any, tmp_path: Path, case: str
) -> None:
    folder = broken_release(quantized_dir, tmp_path, case)
    assert verdicts(folder) == BROKEN[case][3]
    for check in check_folder(folder):
        if check.verdict not in (None, Verdict.LOADS):
            assert check.findings and check.summary().startswith(check.verdict.words), check
            assert all(f.layer.startswith(("model.language_model.", "model.visual.")) for f in check.findings)


def test_a_guard_naming_the_method_drops_every_deltanet_weight(quantized_dir: Any) -> None:
    """SGLang's `linear_attn` guard (sgl-project/sglang issue 22287: the DeltaNet built without the quantization
    config for the methods it names) is gone in 0.5.23; one that named compressed-tensors would build every DeltaNet
    layer bf16 beside the NVFP4 tensors stored for it."""
    layout = read_layout(quantized_dir("nvfp4"))
    sglang = RULES_OF[SGLANG]
    assert check_layout(layout, sglang).verdict is Verdict.LOADS
    guarded = check_layout(layout, replace(sglang, linear_attn_unquantized_for=("compressed-tensors",)))
    assert guarded.verdict is Verdict.MISREADS
    dropped = {finding.layer.rpartition(".")[2] for finding in guarded.findings}
    assert dropped == {"in_proj_qkvz", "out_proj"}  # in_proj_ba is bf16 either way


def test_other_architectures_and_unquantized_folders_get_no_weight_verdict(
    tiny_dir: Path, quantized_dir: Any, tmp_path: Path
) -> None:
    assert verdicts(tiny_dir) == expected(Verdict.LOADS, Verdict.LOADS)
    assert all(not check.findings for check in check_folder(tiny_dir))
    other = tmp_path / "other"
    shutil.copytree(quantized_dir("nvfp4"), other)
    config = json.loads((other / "config.json").read_text(encoding="utf-8"))
    (other / "config.json").write_text(json.dumps({**config, "architectures": ["OtherModel"]}), encoding="utf-8")
    assert set(verdicts(other).values()) == {None}


def vllm_032_decisions(folder: Path) -> dict[str, tuple[Any, ...] | str | None]:
    """vLLM 0.32's own answer for every layer of the clef-vllm row: the quantization config built from the folder's
    config.json and handed to clef-vllm's model class as vLLM's loader does, then asked per layer name."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from vllm.model_executor.model_loader.utils import configure_quant_config

    from clef_vllm.engine.vllm_model import ClefFlashForJointSchema

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))["quantization_config"]
    quant = CompressedTensorsConfig.from_config(copy.deepcopy(config))
    configure_quant_config(quant, ClefFlashForJointSchema)
    rules = RULES_OF["clef-vllm"]
    answers: dict[str, tuple[Any, ...] | str | None] = {}
    for layer in engine_layers(rules, read_layout(folder)):
        # Only the class name is read (a target `Linear` matches it as a substring): the head is a ParallelLMHead,
        # which it does not match, every other layer a *Linear class.
        module = torch.nn.Embedding(1, 1) if layer == HEAD else torch.nn.Linear(1, 1)
        try:
            found = quant.get_scheme_dict(module, engine_name(rules, layer))
        except ValueError:
            answers[layer] = "refused"
            continue
        weights = found["weights"] if found else None
        answers[layer] = None if weights is None else (weights.num_bits, str(weights.strategy), str(weights.type))
    return answers


def our_decisions(folder: Path) -> dict[str, tuple[Any, ...] | str | None]:
    rules, layout = RULES_OF["clef-vllm"], read_layout(folder)
    answers: dict[str, tuple[Any, ...] | str | None] = {}
    for layer in engine_layers(rules, layout):
        decision = decide(layout, rules, layer)
        group = decision.group
        weights = group.weights if group else {}
        answers[layer] = (
            "refused"
            if decision.refusal
            else None
            if group is None
            else (weights["num_bits"], weights["strategy"], weights["type"])
        )
    return answers


@pytest.mark.parametrize("case", [*SCHEMES, *BROKEN])
def test_the_vllm_rows_decide_every_layer_as_vllm_032_does(quantized_dir: Any, tmp_path: Path, case: str) -> None:
    folder = quantized_dir(case) if case in SCHEMES else broken_release(quantized_dir, tmp_path, case)
    ours = our_decisions(folder)
    assert ours == vllm_032_decisions(folder)
    assert any(answer is not None for answer in ours.values())


LOAD = """
import sys
from clef_vllm.engine import ClefEngine
if __name__ == "__main__":
    ClefEngine(sys.argv[1], max_model_len=1024, enforce_eager=True).close()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("in_proj_a of one layer unlisted", "Found different quantization schemes for the shards of"),
        ("in_proj_a and in_proj_b unlisted", "object has no attribute 'data'"),
    ],
)
def test_vllm_032_refuses_where_its_rows_say_it_refuses(
    quantized_dir: Any, tmp_path: Path, case: str, says: str
) -> None:
    folder = broken_release(quantized_dir, tmp_path, case)
    assert verdicts(folder)["clef-vllm"] is Verdict.REFUSES
    script = tmp_path / "load.py"
    script.write_text(LOAD, encoding="utf-8")
    run = subprocess.run([sys.executable, str(script), str(folder)], capture_output=True, text=True, timeout=600)
    assert run.returncode != 0 and says in run.stdout + run.stderr, run.stderr[-3000:]


def test_inspect_engines_says_what_each_engine_makes_of_the_weights(quantized_dir: Any, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from clef_quant.cli import app

    folder = broken_release(quantized_dir, tmp_path, "in_proj_a and in_proj_b unlisted")
    runner = CliRunner()
    result = runner.invoke(app, ["inspect", str(folder), "--engines", "--json"])
    assert result.exit_code == 1, result.output  # the edited config.json no longer matches the manifest
    rows = {row["engine"]: row["weights"] for row in json.loads(result.output)["engines"]}
    assert {name: row["verdict"] for name, row in rows.items()} == {
        name: verdict.words if verdict is not None else None
        for name, verdict in BROKEN["in_proj_a and in_proj_b unlisted"][3].items()
    }
    assert {f["layer"].rpartition(".")[2] for f in rows[SGLANG]["findings"]} == {"in_proj_ba"}
    assert rows["clef-vllm"]["rules_read_from"].startswith("vLLM 0.32")
    table = runner.invoke(app, ["inspect", str(quantized_dir("nvfp4")), "--engines"], env={"COLUMNS": "250"})
    assert table.exit_code == 0 and "weights" in table.output
    assert table.output.count(Verdict.LOADS.words) == len(VLLM) + 1
