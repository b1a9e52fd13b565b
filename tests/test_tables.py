"""The one pipe-table writer behind every report and card table."""

from __future__ import annotations

from pathlib import Path

import pytest

from clef_quant.card_templates import card_environment
from clef_quant.formatting import facts_table, markdown_table

MODEL_CARDS = Path(__file__).resolve().parents[1] / "model_cards"


def cells(line: str) -> list[str]:
    """A pipe-table row read back as a Markdown renderer splits it (no escaped `|` in these cells)."""
    assert line.startswith("|") and line.endswith("|"), line
    return [cell.strip() for cell in line[1:-1].split("|")]


def test_a_table_reads_back_cell_for_cell_with_its_alignment() -> None:
    rows = [["fp8", 1.5, "`tiny-FP8`"], ["nvfp4", 12, "`tiny-NVFP4`"]]
    table = markdown_table(["scheme", "MB", "folder"], rows, "lrl").splitlines()
    assert cells(table[0]) == ["scheme", "MB", "folder"]
    assert table[1] == "|---|---:|---|"
    assert [cells(line) for line in table[2:]] == [[str(cell) for cell in row] for row in rows]


def test_text_first_then_numbers_unless_told() -> None:
    assert markdown_table(["task", "records", "questions"], []).splitlines()[1] == "|---|---:|---:|"


def test_a_report_opens_with_its_facts_under_a_blank_header() -> None:
    lines = facts_table("Throughput", {"machine": "test", "command": "`clef-quant bench`"})
    assert lines == ["# Throughput", "", "| | |", "|---|---|", "| machine | test |", "| command | `clef-quant bench` |"]


@pytest.mark.parametrize("align", ["lr", "lrrx", "LRR"])
def test_an_alignment_that_does_not_fit_the_header_is_refused(align: str) -> None:
    with pytest.raises(ValueError, match="does not give l or r for each of 3 columns"):
        markdown_table(["a", "b", "c"], [], align)


def test_the_card_templates_write_their_tables_through_the_one_writer() -> None:
    rendered = (
        card_environment()
        .from_string('{{ markdown_table(("file", "size"), rows, "lr") }}')
        .render(rows=[("`a`", "1 KiB")])
    )
    assert rendered == markdown_table(("file", "size"), [("`a`", "1 KiB")], "lr")
    by_hand = [
        f"{path.name}:{number}"
        for path in sorted(MODEL_CARDS.glob("*.j2"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if line.startswith("|")
    ]
    assert by_hand == [], "table rows written by hand: " + ", ".join(by_hand)
