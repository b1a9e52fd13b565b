"""clef-quant and clef-vllm as users get them from a wheel: built, installed (not editable) into a fresh folder and
run from a folder outside the checkout, so every shipped file (recipes, task files, fixtures, calibration requests,
the card template, the trees a release carries) must come from the installed package.

The wheels are built from a copy of the checkout's build inputs, so leftovers of earlier builds in the checkout
(`build/`, `*.egg-info`) can neither leak into the wheels nor be left behind by this test. The installed copies
win over the checkout because their folder comes first on PYTHONPATH; every run asserts they did.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from setuptools import find_packages

from clef_quant import shipped
from clef_quant.evaluation.tasks import load_tasks
from clef_quant.quantize.inspect import inspect_checkpoint
from clef_quant.quantize.recipes import load_recipe
from clef_quant.quantize.registry import schemes
from clef_quant.release_folder.manifest import MANIFEST_FILE

# One of the longest modules: handed out early, so both workers end together (tests/plugins/work_units.py).
pytestmark = pytest.mark.unit(order=130)

REPO = Path(__file__).resolve().parents[1]
# What the two builds read: the project files, the code, and the shipped folders (vllm_plugin/ among them).
BUILD_INPUTS = ("pyproject.toml", "README.md", "clef_quant", *shipped.SHIPPED_FOLDERS)
COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "dist", "*.egg-info")
RUN_TIMEOUT_S = 240


def test_pyproject_lists_every_code_package_and_maps_every_shipped_folder() -> None:
    # The package list is explicit (a mapped data package cannot be found by packages.find): a new subpackage of
    # clef_quant that is missing from it would be left out of the wheel.
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    data_packages = {f"clef_quant._data.{name}": name for name in shipped.SHIPPED_FOLDERS}
    assert set(config["packages"]) == set(find_packages(where=str(REPO), include=["clef_quant*"])) | set(data_packages)
    assert config["package-dir"] == data_packages
    assert set(config["package-data"]) == set(data_packages)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both wheels built with pip and installed with `pip install --no-deps --target`; returns the target folder."""
    root = tmp_path_factory.mktemp("wheel")
    source, wheels, target = root / "source", root / "wheels", root / "target"
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=COPY_IGNORE)
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), ".", "./vllm_plugin"]
    run_checked(build, cwd=source)
    built = sorted(wheels.glob("*.whl"))
    assert [w.name.split("-")[0] for w in built] == ["clef_quant", "clef_vllm"], built
    run_checked([*pip, "install", "--no-deps", "--no-index", "--target", str(target), *map(str, built)], cwd=root)
    return target


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working folder outside the checkout, so nothing can be found relative to the current folder."""
    folder = tmp_path / "work"
    folder.mkdir()
    assert REPO not in folder.resolve().parents
    return folder


def run_checked(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def installed_env(target: Path) -> dict[str, str]:
    env = dict(os.environ, COLUMNS="200", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH")) if p)
    return env


def python(target: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run_checked([sys.executable, *args], cwd=cwd, env=installed_env(target))


def clef_quant(target: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return python(target, cwd, "-m", "clef_quant", *args)


def under(path: str | Path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


# What the installed packages report about themselves and their data; run as a script in the installed env.
LOOKUPS = """
import json, sys
from importlib import metadata
from pathlib import Path
import clef_quant, clef_vllm
from clef_quant import shipped
from clef_quant.evaluation.tasks import load_tasks
from clef_quant.card_templates import _shipped_template
from clef_quant.publish.card import TEMPLATE
from clef_quant.publish.folder import copy_trees
from clef_quant.quantize.recipes import scheme_recipe_path
from clef_quant.quantize.registry import schemes

copied = copy_trees(Path(sys.argv[1]))
plugin = metadata.distribution("clef-vllm")
json.dump({
    "clef_quant": clef_quant.__file__,
    "clef_vllm": clef_vllm.__file__,
    "clef_vllm_dist": str(plugin.locate_file("")),
    "vllm_plugins": [ep.value for ep in plugin.entry_points if ep.group == "vllm.general_plugins"],
    "data_root": str(shipped.data_root()),
    "recipes": {scheme: str(scheme_recipe_path(scheme)) for scheme in schemes().names},
    "auto_template": str(shipped.recipes().joinpath("auto.yaml.j2")),
    "tasks": {task.name: str(task.path) for task in load_tasks()},
    "template": _shipped_template(TEMPLATE),
    "copied": copied,
}, sys.stdout)
"""


@pytest.mark.slow
def test_installed_packages_find_their_data_outside_the_checkout(installed: Path, elsewhere: Path) -> None:
    release = elsewhere / "release"
    found: dict[str, Any] = json.loads(python(installed, elsewhere, "-c", LOOKUPS, str(release)).stdout)
    for key in ("clef_quant", "clef_vllm", "clef_vllm_dist", "data_root"):
        assert under(found[key], installed), (key, found[key])
    assert found["vllm_plugins"] == ["clef_vllm.engine.plugin:register"]  # vLLM finds the installed plugin
    assert found["recipes"] and all(under(p, installed) and Path(p).is_file() for p in found["recipes"].values())
    assert list(found["recipes"]) == list(schemes().names)  # every scheme of the checkout's recipes/, in order
    assert under(found["auto_template"], installed) and Path(found["auto_template"]).is_file()
    assert sorted(found["tasks"]) == sorted(task.name for task in load_tasks(REPO / "eval" / "tasks"))
    assert all(under(p, installed) for p in found["tasks"].values())
    assert found["template"] == (REPO / "model_cards" / "quantized.md.j2").read_text(encoding="utf-8")
    # The plugin tree a release carries, complete and installable on its own as the card says; of scripts/, only
    # what serving needs (the demo, fixture and setup scripts are for this repository, not for a model repo).
    expected = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "vllm_plugin").rglob("*") if p.is_file())
    expected = [n for n in expected if "__pycache__" not in n and ".egg-info" not in n and "/build/" not in n]
    assert sorted(n for n in found["copied"] if n.startswith("vllm_plugin/")) == expected
    assert sorted(n for n in found["copied"] if n.startswith("scripts/")) == ["scripts/patch_torchvision.py"]
    assert (release / "vllm_plugin" / "pyproject.toml").is_file()


@pytest.mark.slow
def test_console_script_and_card_help_run_from_the_install(installed: Path, elsewhere: Path) -> None:
    script = installed / "bin" / "clef-quant"
    result = run_checked([str(script), "--help"], cwd=elsewhere, env=installed_env(installed))
    assert "quantize" in result.stdout and "build-data" in result.stdout
    assert "--results" in clef_quant(installed, elsewhere, "card", "--help").stdout


@pytest.mark.slow
def test_quantize_with_a_shipped_recipe_from_the_install(installed: Path, elsewhere: Path, tiny_dir: Path) -> None:
    out = elsewhere / "tiny-FP8_DYNAMIC"
    clef_quant(installed, elsewhere, "quantize", str(tiny_dir), "--scheme", "fp8-dynamic", "--out", str(out))
    manifest = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
    # The installed recipe, filled as the checkout fills its own: the same text llm-compressor is given.
    source_config = json.loads((tiny_dir / "config.json").read_text(encoding="utf-8"))
    assert manifest["recipe"]["text"] == load_recipe("fp8-dynamic", None, source_config).text
    assert under(manifest["recipe"]["file"], installed)
    assert inspect_checkpoint(out).ok


@pytest.mark.slow
def test_build_data_from_the_shipped_fixtures_of_the_install(installed: Path, elsewhere: Path) -> None:
    out = elsewhere / "data"
    clef_quant(
        installed, elsewhere, "build-data", "--out", str(out), "--source", "fixtures", "--per-task", "2",
        "--calibration-count", "4",
    )  # fmt: skip
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["source"] == "eval/fixtures"  # named as in the repository, not by the install's path
    counts = summary["counts"]
    assert counts["eval_records"] == 2 * len(summary["tasks"]) and counts["calibration_records"] == 4
    assert {t["task_file"]["path"] for t in summary["tasks"].values()} == {
        f"eval/tasks/{name}.yaml" for name in summary["tasks"]
    }
