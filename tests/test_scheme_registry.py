"""Schemes are recipe files: what `--scheme`, the scan, the benchmarks and the card know about a scheme is read from
its recipe's front matter, and every recipe's `ignore` is the one keep-list.

A toy scheme is added the way a contributor would, by writing one file into (a copy of) `recipes/`; the CLI, run as
its own process on that folder, lists it, quantizes the tiny release with it, and the card has its words.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clef_quant import shipped
from clef_quant.publish.card import scheme_words
from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.plan import parse_recipe, recipe_needs_calibration
from clef_quant.quantize.recipes import KEEP_BF16, is_kept_bf16, load_recipe
from clef_quant.quantize.registry import load_registry, schemes
from clef_quant.quantize.streaming import streaming_problem
from clef_quant.release_folder.manifest import MANIFEST_FILE

REPO = Path(__file__).resolve().parents[1]
CONFIG = {"text_config": {"num_hidden_layers": 4}}

TOY = """\
# A toy scheme: INT8 weights per output channel, bf16 activations, round to nearest (no data).
clef:
  name: int8-toy
  labels: [W8A16]
  calibration: false
  scan: {order: 8}
  card:
    description: INT8 toy weights, one scale per output channel; activations stay bf16.
    hardware: Toy hardware note for INT8 weights.
---
default_stage:
  default_modifiers:
    QuantizationModifier:
      targets: [Linear]
      ignore: {{ keep_bf16 | yaml_list }}
      scheme: W8A16
"""

# Runs the CLI with the shipped data read from argv[1] instead of the checkout, as an install would read its own.
CLI_ON_ROOT = (
    "import sys; from pathlib import Path; from clef_quant import shipped; "
    "root = Path(sys.argv.pop(1)); shipped.data_root = lambda: root; "
    "from clef_quant.cli import app; app(prog_name='clef-quant')"
)


def data_root_with(tmp_path: Path, name: str, text: str) -> Path:
    """A data root whose recipes/ is a copy of the shipped one plus one file; the other folders are the shipped ones."""
    root = tmp_path / "data"
    root.mkdir()
    for folder in shipped.SHIPPED_FOLDERS:
        if folder == shipped.RECIPES:
            shutil.copytree(REPO / folder, root / folder)
        else:
            (root / folder).symlink_to(REPO / folder)
    (root / shipped.RECIPES / name).write_text(text)
    return root


def cli_on(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLI_ON_ROOT, str(root), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "1000"},
        timeout=900,
    )


# -- the keep-list ----------------------------------------------------------------------------------------------


def quantizing_modifiers(name: str) -> list:
    recipe = parse_recipe(load_recipe(name, None, CONFIG).text)
    return [m for m in recipe.modifiers if type(m).__name__ in ("QuantizationModifier", "GPTQModifier")]


@pytest.mark.parametrize("name", schemes().names)
def test_every_recipe_ignores_the_keep_list_as_llm_compressor_reads_it(name: str) -> None:
    modifiers = quantizing_modifiers(name)
    assert modifiers, name
    for modifier in modifiers:
        assert list(modifier.ignore) == list(KEEP_BF16), name
    # The entries every recipe file held before the keep-list was filled in; a change here changes every release.
    assert KEEP_BF16 == ("lm_head", r"re:model\.visual\..*", r"re:.*linear_attn\.in_proj_[ab]$")


def test_keep_list_holds_the_modules_the_card_gives_a_reason_for() -> None:
    names = {
        "lm_head": "lm_head",
        "vision": "model.visual.blocks.0.attn.qkv",
        "linear_attn.in_proj_a": "model.language_model.layers.0.linear_attn.in_proj_a",
        "linear_attn.in_proj_b": "model.language_model.layers.0.linear_attn.in_proj_b",
    }
    reasons = scheme_words(schemes())["keep_reasons"]
    assert sorted(reasons) == sorted(names)
    assert all(is_kept_bf16(module) for module in names.values())
    assert not is_kept_bf16("model.language_model.layers.0.linear_attn.in_proj_qkv")


# -- what the front matter says matches the recipe ------------------------------------------------------------------


@pytest.mark.parametrize("name", schemes().names)
def test_front_matter_says_what_the_recipe_does(name: str) -> None:
    scheme = schemes().scheme(name)
    recipe = parse_recipe(load_recipe(name, None, CONFIG).text)
    assert recipe_needs_calibration(recipe) == scheme.calibration
    if scheme.streaming:
        assert streaming_problem(recipe) is None
    recorded = load_recipe(name, None, CONFIG).text
    assert "clef:" not in recorded and recorded.lstrip().startswith("#")


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"a.yaml": TOY, "b.yaml": TOY}, "int8-toy is named by both a.yaml and b.yaml"),
        ({"a.yaml": TOY, "b.yaml": TOY.replace("int8-toy", "int8-two")}, "both have card words for W8A16"),
        ({"a.yaml": "default_stage: {}\n"}, "has no `clef:` front matter"),
        ({"a.yaml": TOY.replace("calibration: false", "calibration: maybe")}, "front matter calibration"),
        ({"a.yaml": TOY.replace("name: int8-toy", "name: Int8 Toy")}, "front matter name"),
    ],
)
def test_a_broken_recipes_folder_is_refused_with_the_file(tmp_path: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(QuantizeError, match=message):
        load_registry(tmp_path)


# -- a toy scheme: one new file ---------------------------------------------------------------------------------


def test_a_new_recipe_file_is_a_scheme_everywhere_in_the_library(tmp_path: Path) -> None:
    root = data_root_with(tmp_path, "int8_toy.yaml", TOY)
    registry = load_registry(root / shipped.RECIPES)
    assert registry.names == (*schemes().names, "int8-toy")  # no order given: after the shipped ones
    assert registry.scannable() == (*schemes().scannable(), "int8-toy")
    assert registry.default_scan() == schemes().default_scan()
    words = scheme_words(registry)
    assert words["scheme_descriptions"]["W8A16"].startswith("INT8 toy weights")
    assert words["hardware_notes"]["W8A16"] == "Toy hardware note for INT8 weights."
    assert "W8A16" not in words["cpu_notes"]  # nothing claimed


@pytest.mark.slow
def test_a_new_recipe_file_is_a_scheme_the_cli_lists_and_quantizes_with(tiny_dir: Path, tmp_path: Path) -> None:
    root = data_root_with(tmp_path, "int8_toy.yaml", TOY)
    shown = cli_on(root, "quantize", "--help")
    assert shown.returncode == 0, shown.stderr
    assert "int8-toy, auto." in shown.stdout
    assert "int8-toy" in cli_on(root, "scan", "--help").stdout

    out = tmp_path / "tiny-INT8"
    done = cli_on(root, "quantize", str(tiny_dir), "--scheme", "int8-toy", "--out", str(out))
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["scheme"] == "int8-toy" and "clef:" not in manifest["recipe"]["text"]
    inspected = cli_on(root, "inspect", str(out), "--json")
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    modules = json.loads(inspected.stdout)["modules"]
    assert {m["scheme"] for m in modules if not is_kept_bf16(m["name"])} == {"W8A16"}
    assert {m["scheme"] for m in modules if is_kept_bf16(m["name"])} == {"bf16"}


# -- bench throughput: quantized folders of any scheme ------------------------------------------------------------


def test_throughput_rows_are_named_by_the_scheme_a_folder_records(quantized_dir, tmp_path: Path) -> None:
    from clef_quant.bench.throughput import plugin_side_name

    assert plugin_side_name(quantized_dir("fp8-dynamic")) == "FP8_DYNAMIC"  # as the old --fp8 row was named
    (tmp_path / "tiny-x").mkdir()
    assert plugin_side_name(tmp_path / "tiny-x") == "tiny-x"  # no manifest: the folder's name


@pytest.mark.parametrize("flag", ["--quantized", "--fp8", "--nvfp4"])
def test_bench_throughput_takes_quantized_folders_and_the_old_flags(tmp_path: Path, flag: str) -> None:
    from typer.testing import CliRunner

    from clef_quant.cli import app

    shown = CliRunner().invoke(app, ["bench", "throughput", "--help"], env={"COLUMNS": "200"}).output
    assert "--quantized" in shown and "--fp8" not in shown and "--nvfp4" not in shown
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "config.json").write_text("{}")
    args = ["bench", "throughput", "--reference", str(tmp_path / "ref"), "--data", str(tmp_path), flag]
    result = CliRunner().invoke(app, [*args, str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == f"error: {tmp_path / 'nope'} is not a release folder"
