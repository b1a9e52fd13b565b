"""One `clef-quant quantize` run does each thing once: the scheme is checked once (where the command line is parsed,
or where the library is entered), and the plan's refusals come before any model loads, on the oneshot path too.

The model loader is replaced by one that fails the run, under the name the run calls it by; a companion test shows
that a run the plan accepts does reach it, so a refusal that leaves it untouched really stopped before loading.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from clef_quant.cli import app
from clef_quant.quantize import recipes
from clef_quant.quantize import run as quantize_run
from clef_quant.quantize.errors import QuantizeError
from clef_quant.quantize.run import QuantizeConfig, quantize
from clef_quant.release_folder.writer import partial_of

# NVFP4 with calibrated activation scales over every Linear, lm_head and the DeltaNet gates included: a recipe for
# the calibrated oneshot path that the plan refuses (the keep-list).
GREEDY_NVFP4 = """\
default_stage:
  default_modifiers:
    QuantizationModifier:
      targets: [Linear]
      scheme: NVFP4
      ignore: ['re:model\\.visual\\..*']
"""


class LoaderReached(Exception):
    """The run got as far as loading the model."""


@pytest.fixture
def loader(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The sources the run tried to load a model from; the loader fails the run instead of loading."""
    reached: list[Path] = []

    def refuse(source_dir: Path, *_args: object) -> None:
        reached.append(source_dir)
        raise LoaderReached(str(source_dir))

    monkeypatch.setattr(quantize_run, "load_model", refuse)  # raising=True: the run must call it by this name
    return reached


def cli(*args: str) -> object:
    return CliRunner().invoke(app, list(args))


def test_a_plan_the_oneshot_path_refuses_stops_before_the_model_loads(
    tiny_dir: Path, tmp_path: Path, loader: list[Path]
) -> None:
    recipe = tmp_path / "greedy.yaml"
    recipe.write_text(GREEDY_NVFP4)
    out = tmp_path / "out"
    result = cli("quantize", str(tiny_dir), "--recipe", str(recipe), "--calibration-records", "1", "--out", str(out))
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()  # the refusal alone: no bar was ever drawn
    assert line.startswith("error: the recipe quantizes") and "must stay bf16" in line and "lm_head" in line
    assert loader == []
    assert not out.exists() and not partial_of(out).exists()

    stages: list[str] = []
    config = QuantizeConfig(source=str(tiny_dir), out=out, recipe_file=recipe, calibration_records=1)
    with pytest.raises(QuantizeError, match="must stay bf16"):
        quantize(config, on_stage=stages.append)
    assert stages == [] and loader == []  # refused among the checks: not even "checked"
    assert not out.exists() and not partial_of(out).exists()


def test_a_plan_the_oneshot_path_accepts_reaches_the_loader(tiny_dir: Path, tmp_path: Path, loader: list[Path]) -> None:
    out = tmp_path / "out"
    stages: list[str] = []
    config = QuantizeConfig(source=str(tiny_dir), out=out, scheme="nvfp4", calibration_records=1)
    with pytest.raises(LoaderReached):
        quantize(config, on_stage=stages.append)
    assert loader == [tiny_dir.absolute()] and stages == ["checked", "claimed"]
    assert not out.exists() and not partial_of(out).exists()


def test_a_run_checks_its_scheme_once(tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    choices = recipes.scheme_choices

    def counted() -> tuple[str, ...]:
        asked.append("asked")
        return choices()

    monkeypatch.setattr(recipes, "scheme_choices", counted)
    result = cli("quantize", str(tiny_dir), "--scheme", "fp8-dynamic", "--out", str(tmp_path / "cli"))
    assert result.exit_code == 0, result.output
    assert len(asked) == 1  # by the parser; the run it starts takes the scheme as checked
    quantize(QuantizeConfig(source=str(tiny_dir), out=tmp_path / "library", scheme="fp8-dynamic"))
    assert len(asked) == 2  # where the library is entered


def test_an_unknown_scheme_is_refused_in_the_same_line_by_the_parser_and_the_library(tmp_path: Path) -> None:
    result = cli("quantize", str(tmp_path / "nope"), "--scheme", "int3", "--out", str(tmp_path / "cli"))
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    with pytest.raises(QuantizeError) as refused:
        quantize(QuantizeConfig(source=str(tmp_path / "nope"), out=tmp_path / "library", scheme="int3"))
    assert line == f"error: {refused.value}" and "unknown scheme 'int3'" in line


def test_a_device_out_of_memory_ends_in_one_line_and_leaves_no_folder(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    def out_of_memory(*_args: object) -> None:  # what CUDA's allocator raises when the model does not fit
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.18 GiB of which "
            "6.19 MiB is free. Including non-PyTorch memory, this process has 79.16 GiB memory in use."
        )

    monkeypatch.setattr(quantize_run, "load_model", out_of_memory)
    out = tmp_path / "out"
    result = cli("quantize", str(tiny_dir), "--scheme", "nvfp4", "--calibration-records", "1", "--out", str(out))
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "ran out of memory while quantizing" in line and "Tried to allocate 20.00 MiB" in line
    assert "--device cpu" in line and "Traceback" not in result.output
    assert not out.exists() and not partial_of(out).exists()
