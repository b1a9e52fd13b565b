"""The model card `make-tiny` writes: it says the weights are random, and its front matter says so to later steps.

`quantize` carries a source's `README.md` into its output as `source_card.md`, so a release made from a tiny folder
keeps the mark even when the folder itself is gone; `clef-quant card` reads it (`made_by_make_tiny`) to warn that
the numbers mean nothing and to name the `make-tiny` run in Reproduce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clef_quant.families import MAKE_TINY_MARK

CARD_FILE = "README.md"
TEMPLATE = "tiny.md.j2"
# The front matter key of the mark: {"size", "seed", "model"} of the make-tiny run (model: a clef_quant.families
# key). `--overwrite` replaces only a folder whose card carries it (release_folder/outputs.py).
MARK = MAKE_TINY_MARK
LICENSE = "apache-2.0"  # clef-quant's own license: the weights are drawn by its code
TAGS = ("clef", "random-weights")


def write_card(folder: Path, size: str, seed: int, model: str) -> Path:
    from huggingface_hub import ModelCardData

    from clef_quant.card_templates import card_environment

    data = ModelCardData(license=LICENSE, tags=list(TAGS), **{MARK: {"size": size, "seed": seed, "model": model}})
    text = card_environment().get_template(TEMPLATE).render(card_data=data.to_yaml(), size=size, seed=seed)
    path = Path(folder) / CARD_FILE
    path.write_text(text, encoding="utf-8")
    return path


def made_by_make_tiny(front_matter: dict[str, Any]) -> dict[str, Any] | None:
    """The make-tiny run ({"size", "seed"}) a model card's front matter names, or None for any other card."""
    mark = front_matter.get(MARK)
    if not isinstance(mark, dict) or not isinstance(mark.get("size"), str) or not isinstance(mark.get("seed"), int):
        return None
    return {"size": mark["size"], "seed": mark["seed"]}
