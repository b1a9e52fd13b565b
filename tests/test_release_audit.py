"""The load-safety audit of `clef-quant inspect` (clef_quant/quantize/audit*.py) on real quantized tiny releases.

Every release quantize writes passes it, on every scheme and model. Then a copy is broken in one way at a time: a
tensor of a shard rewritten (safetensors' own load_file / save_file, the shard's metadata kept) or a config entry
changed, and the manifest's sha256 of each rewritten file updated, so that the manifest check holds and the one
failure is the rule the break is about, naming its tensor or module.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from clef_quant.cli import app
from clef_quant.publish.upload import check_release
from clef_quant.quantize import registry
from clef_quant.quantize.inspect import inspect_checkpoint
from clef_quant.quantize.inspect_report import (
    CHECK_FUSED,
    CHECK_NAMES,
    CHECK_SCALES,
    CHECK_TARGETS,
    CHECK_ZEROS,
    InspectReport,
)
from clef_quant.release_folder.manifest import hash_files, read_manifest, write_manifest

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = pytest.mark.unit(order=190)

AUDIT = (CHECK_SCALES, CHECK_ZEROS, CHECK_FUSED, CHECK_TARGETS, CHECK_NAMES)
SHARD = "model.safetensors"
INDEX = "model.safetensors.index.json"
LAYER = "model.language_model.layers.1"
DOWN = f"{LAYER}.mlp.down_proj"  # in no fused group, so a broken scale trips one rule only


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def audit_lines(report: InspectReport) -> dict[str, str]:
    return {c.name: c.status for c in report.checks if c.name in AUDIT}


def broken_copy(folder: Path, to: Path) -> Path:
    return Path(shutil.copytree(folder, to))


def rehash(folder: Path, *names: str) -> None:
    """Make the manifest list the files as they are now: only the audit can see what changed."""
    manifest = read_manifest(folder)
    assert manifest is not None
    data = manifest.to_json()
    data["files"].update(hash_files(folder, names))
    write_manifest(folder, data)


def rewrite_shard(folder: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    with safe_open(str(folder / SHARD), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(folder / SHARD)
    change(tensors)
    save_file(tensors, folder / SHARD, metadata=metadata)
    rehash(folder, SHARD)


def rewrite_json(folder: Path, name: str, change: Callable[[dict], None]) -> None:
    data = json.loads((folder / name).read_text())
    change(data)
    (folder / name).write_text(json.dumps(data, indent=2))
    rehash(folder, name)


def only_violations(folder: Path, check: str) -> list[tuple[str, str]]:
    """The (subject, message) of each violation, after asserting they are all `check`'s and the CLI fails too."""
    report = inspect_checkpoint(folder)
    assert {v.check for v in report.violations} == {check}, [str(v) for v in report.violations]
    assert audit_lines(report)[check] == "fail"
    result = cli("inspect", str(folder))
    assert result.exit_code == 1
    first = report.violations[0].subject
    assert first in result.output.replace("\n", ""), result.output
    return [(v.subject, v.message) for v in report.violations]


# -- every release quantize writes passes ------------------------------------------------------------------------

TINY_SCHEMES = registry.schemes().names  # every scheme quantize ships
FAMILY_RELEASES = [("omni-tiny", "fp8-dynamic"), ("omni-tiny", "nvfp4"), ("omni-tiny", "fp8-block")]
FAMILY_RELEASES += [("clef-tiny", "nvfp4a16")]


@pytest.mark.parametrize("scheme", TINY_SCHEMES)
def test_every_tiny_scheme_passes_the_audit(quantized_dir, scheme: str) -> None:
    report = inspect_checkpoint(quantized_dir(scheme))
    assert report.ok, [str(v) for v in report.violations]
    assert audit_lines(report) == dict.fromkeys(AUDIT, "pass")


@pytest.mark.parametrize(("size", "scheme"), FAMILY_RELEASES)
def test_every_family_release_passes_the_audit(family_quantized, size: str, scheme: str) -> None:
    report = inspect_checkpoint(family_quantized(size, scheme))
    assert report.ok, [str(v) for v in report.violations]
    assert audit_lines(report) == dict.fromkeys(AUDIT, "pass")


@pytest.mark.parametrize("size", ["tiny", "omni-tiny"])
def test_a_bf16_source_holds_the_names_its_architecture_loads(tiny_dir: Path, family_dir, size: str) -> None:
    report = inspect_checkpoint(tiny_dir if size == "tiny" else family_dir(size))
    assert report.ok and report.kind == "source"
    lines = audit_lines(report)
    assert lines[CHECK_NAMES] == "pass"  # no scales, weights or targets to check in bf16: those say skipped
    assert {lines[c] for c in (CHECK_SCALES, CHECK_ZEROS, CHECK_TARGETS)} == {"skipped"}


# -- rule 1: scales ------------------------------------------------------------------------------------------------


def test_a_nan_block_scale_fails_naming_the_tensor_in_inspect_and_upload(quantized_dir, tmp_path: Path) -> None:
    folder = broken_copy(quantized_dir("nvfp4"), tmp_path / "nan")
    name = f"{DOWN}.weight_scale"  # NVFP4's FP8 scale of each block of 16

    def poison(tensors: dict[str, torch.Tensor]) -> None:
        scale = tensors[name].float()
        scale[3, 2] = float("nan")
        tensors[name] = scale.to(torch.float8_e4m3fn)

    rewrite_shard(folder, poison)
    [(subject, message)] = only_violations(folder, CHECK_SCALES)
    assert subject == name and "1 NaN" in message and "[3, 2]" in message
    assert any(problem.startswith(f"{name}: ") for problem in check_release(folder))


@pytest.mark.parametrize(
    ("scheme", "param", "value", "kind"),
    [
        ("fp8-dynamic", "weight_scale", 0.0, "zero or negative"),  # per-channel BF16 scales
        ("nvfp4", "weight_global_scale", -2.0, "zero or negative"),
        ("nvfp4", "input_global_scale", float("inf"), "infinite"),
    ],
)
def test_a_zero_negative_or_infinite_scale_fails(
    quantized_dir, tmp_path: Path, scheme: str, param: str, value: float, kind: str
) -> None:
    folder = broken_copy(quantized_dir(scheme), tmp_path / "bad")
    name = f"{DOWN}.{param}"

    def set_first(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name].view(-1)[0] = value

    rewrite_shard(folder, set_first)
    [(subject, message)] = only_violations(folder, CHECK_SCALES)
    assert subject == name and f"1 {kind}" in message


# -- rule 2: zeroed rows and blocks ----------------------------------------------------------------------------


def zero_fp4(rows: slice, byte_columns: slice) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(tensors: dict[str, torch.Tensor]) -> None:
        tensors[f"{DOWN}.weight_packed"][rows, byte_columns] = 0x80  # -0.0 and +0.0: zero codes both

    return change


def test_a_zeroed_row_of_a_packed_fp4_weight_fails(quantized_dir, tmp_path: Path) -> None:
    folder = broken_copy(quantized_dir("nvfp4a16"), tmp_path / "fp4-row")
    rewrite_shard(folder, zero_fp4(slice(7, 8), slice(None)))
    [(subject, message)] = only_violations(folder, CHECK_ZEROS)
    assert subject == DOWN
    assert "FP4" in message and "1 whole row" in message and "row 7" in message


def test_a_zeroed_fp4_block_fails_against_the_source_and_passes_without_it(quantized_dir, tmp_path: Path) -> None:
    """One block of 16 values zeroed inside a row: only the bf16 source tells it from honest rounding."""
    folder = broken_copy(quantized_dir("nvfp4a16"), tmp_path / "fp4-block")
    rewrite_shard(folder, zero_fp4(slice(5, 6), slice(8, 16)))  # values 16-31 of row 5
    [(subject, message)] = only_violations(folder, CHECK_ZEROS)
    assert subject == DOWN and "1x16" in message and "row 5, columns 16-31" in message

    manifest = read_manifest(folder)
    assert manifest is not None
    data = manifest.to_json()
    data["source"]["id"] = str(tmp_path / "moved-away")
    write_manifest(folder, data)
    report = inspect_checkpoint(folder)
    assert report.ok and audit_lines(report)[CHECK_ZEROS] == "pass"
    assert any("not compared" in note and "moved-away" in note for note in report.notes)

    rewrite_shard(folder, zero_fp4(slice(9, 10), slice(None)))  # a whole row still fails without the source
    [(subject, message)] = only_violations(folder, CHECK_ZEROS)
    assert subject == DOWN and "row 9" in message and "not compared with the bf16 source" in message


def test_a_hub_source_not_in_the_local_cache_is_named_and_not_downloaded(quantized_dir, tmp_path: Path) -> None:
    folder = broken_copy(quantized_dir("nvfp4a16"), tmp_path / "hub-source")
    manifest = read_manifest(folder)
    assert manifest is not None
    data = manifest.to_json()
    data["source"] = {"id": "clef-tests/never-published", "revision": "abc123", "local": False}
    write_manifest(folder, data)
    report = inspect_checkpoint(folder)
    assert report.ok and "rows only" in {c.name: c.detail for c in report.checks}[CHECK_ZEROS]
    assert any("clef-tests/never-published@abc123 is not in the local Hugging Face cache" in n for n in report.notes)


@pytest.mark.parametrize(("scheme", "rows", "columns", "expected"), [
    ("fp8-dynamic", slice(11, 12), slice(None), "row 11"),  # per-channel scales: a block is a row
    ("fp8-block", slice(0, 128), slice(128, 256), "rows 0-127, columns 128-255"),  # one 128x128 tile of two
])  # fmt: skip
def test_a_zeroed_fp8_row_or_block_fails(
    quantized_dir, tmp_path: Path, scheme: str, rows: slice, columns: slice, expected: str
) -> None:
    folder = broken_copy(quantized_dir(scheme), tmp_path / "fp8")

    def zero(tensors: dict[str, torch.Tensor]) -> None:
        tensors[f"{DOWN}.weight"].view(torch.uint8)[rows, columns] = 0  # +0.0 in FP8 E4M3

    rewrite_shard(folder, zero)
    [(subject, message)] = only_violations(folder, CHECK_ZEROS)
    assert subject == DOWN and "FP8" in message and expected in message


# -- rule 3: targets and ignore entries ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "entry"),
    [
        ("ignore", f"{LAYER}.linear_attn.in_proj_bb"),  # a typo: in_proj_b stays in the list, so nothing else moves
        ("ignore", r"re:model\.vision\..*"),  # the tower is `visual`
        ("targets", "Linear4bit"),  # a class of another library (bitsandbytes), not of this model
    ],
)
def test_an_entry_that_matches_no_module_fails(quantized_dir, tmp_path: Path, where: str, entry: str) -> None:
    folder = broken_copy(quantized_dir("fp8-dynamic"), tmp_path / "entries")

    def add(config: dict) -> None:
        quantization = config["quantization_config"]
        if where == "ignore":
            quantization["ignore"].append(entry)
        else:
            quantization["config_groups"]["group_0"]["targets"].append(entry)

    rewrite_json(folder, "config.json", add)
    [(subject, message)] = only_violations(folder, CHECK_TARGETS)
    assert subject == entry and where in message and "Qwen3_5ForConditionalGeneration" in message
    if where == "ignore" and not entry.startswith("re:"):
        assert "nearest module" in message and f"{LAYER}.linear_attn.in_proj_b" in message


# -- rule 4: fused global scales ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "tensor", "group"),
    [
        ("tiny", f"{LAYER}.linear_attn.in_proj_z.weight_global_scale", f"{LAYER}.linear_attn"),
        ("omni-tiny", "thinker.model.layers.1.mlp.experts.2.up_proj.weight_global_scale",
         "thinker.model.layers.1.mlp.experts.2"),
    ],
)  # fmt: skip
def test_unequal_fused_global_scales_fail(
    quantized_dir, family_quantized, tmp_path: Path, size: str, tensor: str, group: str
) -> None:
    source = quantized_dir("nvfp4") if size == "tiny" else family_quantized(size, "nvfp4")
    folder = broken_copy(source, tmp_path / "fused")

    def halve(tensors: dict[str, torch.Tensor]) -> None:
        tensors[tensor] = tensors[tensor] * 0.5

    rewrite_shard(folder, halve)
    [(subject, message)] = only_violations(folder, CHECK_FUSED)
    assert subject == group and "weight_global_scale differs" in message


# -- rule 5: the names the architecture loads ----------------------------------------------------------------------

NORM = f"{LAYER}.input_layernorm.weight"
RENAMED = f"{LAYER}.input_layer_norm.weight"


@pytest.mark.parametrize("in_index", [True, False])
def test_a_renamed_tensor_fails_naming_both_names(quantized_dir, tmp_path: Path, in_index: bool) -> None:
    folder = broken_copy(quantized_dir("nvfp4"), tmp_path / "renamed")
    rewrite_shard(folder, lambda tensors: tensors.update({RENAMED: tensors.pop(NORM)}))
    if in_index:
        rewrite_json(folder, INDEX, lambda index: index["weight_map"].update({RENAMED: index["weight_map"].pop(NORM)}))
    found = only_violations(folder, CHECK_NAMES)
    said = {name: " | ".join(message for subject, message in found if subject == name) for name, _ in found}
    assert set(said) == {RENAMED, NORM}
    assert "not a tensor of Qwen3_5ForConditionalGeneration" in said[RENAMED] and NORM in said[RENAMED]
    if in_index:
        assert len(found) == 2 and "no shard holds it" in said[NORM]
    else:  # the index still names the old tensor: it is the index's word against the shard's
        assert f"names shard {SHARD}, which does not hold it" in said[NORM]
        assert f"not in {INDEX}" in said[RENAMED]


def test_a_tensor_of_the_wrong_shape_fails(quantized_dir, tmp_path: Path) -> None:
    folder = broken_copy(quantized_dir("fp8-dynamic"), tmp_path / "shape")
    rewrite_shard(folder, lambda tensors: tensors.update({NORM: tensors[NORM][:-1].clone()}))
    [(subject, message)] = only_violations(folder, CHECK_NAMES)
    assert subject == NORM and "stored as [127]" in message and "[128]" in message
