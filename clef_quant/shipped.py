"""The data that ships with clef-quant: recipes, task files, calibration requests, dataset fixtures, the model card
template, and the trees every release carries (`vllm_plugin/`, `scripts/`).

In the repository these are top-level folders. A wheel carries them as package data in `clef_quant/_data/<folder>/`
(pyproject.toml maps each folder there at build time), so an installed clef-quant finds them through
importlib.resources wherever it runs. A source checkout (run through PYTHONPATH or an editable install) has no
`_data/`: there the checkout's own folders are the data. Both are looked up next to the `clef_quant` package that
was imported, so code and data always come from the same tree.

Every lookup returns an `importlib.resources` Traversable; a caller that needs a real path (to copy a folder, or for
a library that opens files itself) wraps it in `importlib.resources.as_file`.
"""

from __future__ import annotations

import functools
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

DATA_PACKAGE_DIR = "_data"
RECIPES = "recipes"
EVAL = "eval"
MODEL_CARDS = "model_cards"
SCRIPTS = "scripts"
VLLM_PLUGIN = "vllm_plugin"
SHIPPED_FOLDERS = (RECIPES, EVAL, MODEL_CARDS, SCRIPTS, VLLM_PLUGIN)


@functools.cache
def data_root() -> Traversable:
    """The folder holding the shipped folders: `clef_quant/_data` when installed, else the source checkout."""
    installed = resources.files("clef_quant").joinpath(DATA_PACKAGE_DIR)
    if installed.is_dir():
        return installed
    checkout = Path(__file__).resolve().parent.parent
    if all((checkout / name).is_dir() for name in SHIPPED_FOLDERS):
        return checkout
    # Neither: a broken install. Pointing at where the data should be makes every read name the missing file.
    return installed


def folder(name: str) -> Traversable:
    """One shipped folder by its repository name, e.g. `folder("recipes")`."""
    if name not in SHIPPED_FOLDERS:
        raise ValueError(f"{name!r} is not a shipped folder; they are {', '.join(SHIPPED_FOLDERS)}")
    return data_root().joinpath(name)


def recipes() -> Traversable:
    return folder(RECIPES)


def tasks() -> Traversable:
    return folder(EVAL).joinpath("tasks")


def calibration_file() -> Traversable:
    return folder(EVAL).joinpath("calibration", "default.jsonl")


def fixtures() -> Traversable:
    """Synthetic rows laid out as the Hub's Parquet export of every task's dataset (see scripts/make_fixtures.py)."""
    return folder(EVAL).joinpath("fixtures")


def model_cards() -> Traversable:
    return folder(MODEL_CARDS)


def display(path: Path | Traversable) -> str:
    """A shipped file by its repository path (`eval/tasks/mmlu.yaml`), the same wherever clef-quant is installed, so
    summaries and manifests do not differ between machines; any other path as given."""
    root = data_root()
    if isinstance(root, Path):
        try:
            relative = Path(str(path)).resolve().relative_to(root.resolve())
        except ValueError:
            return str(path)
        if relative.parts and relative.parts[0] in SHIPPED_FOLDERS:
            return relative.as_posix()
    return str(path)
