"""The Jinja2 environment of the shipped `model_cards/` templates, with the number formats they use.

Two cards are rendered from these templates: a quantized release's (`publish.card`) and a tiny folder's
(`tiny.card`); the environment sits below both so that make-tiny does not depend on the publishing tools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clef_quant import shipped
from clef_quant.formatting import binary_size, count, markdown_table

if TYPE_CHECKING:
    import jinja2


def card_environment() -> jinja2.Environment:
    """The Jinja2 environment of the card templates, with the number formats they use."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_shipped_template),
        undefined=jinja2.StrictUndefined,  # a missing fact is a bug, never an empty cell
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # markdown, not HTML
        extensions=["jinja2.ext.do"],  # tables: rows appended in the template, written by markdown_table
    )
    env.globals["markdown_table"] = markdown_table
    env.filters["size"] = binary_size
    env.filters["count"] = count
    env.filters["thousands"] = lambda n: f"{n:,}"
    env.filters["pct"] = lambda v: f"{100 * v:.1f}%"
    env.filters["known"] = lambda value: "?" if value is None else value  # a fact an older file does not have
    env.filters["plural"] = lambda n, word: f"{n:,} {word}" + ("" if n == 1 else "s")
    return env


def _shipped_template(name: str) -> str | None:
    """A template of the shipped `model_cards/` folder; None (jinja2's "not found") when there is none."""
    template = shipped.model_cards().joinpath(name)
    return template.read_text(encoding="utf-8") if template.is_file() else None
