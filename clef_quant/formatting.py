"""How numbers, lists of problems and tables read in messages, reports and cards: written once so they read alike.

Sizes on disk and in memory use binary units (`1.5 GiB`) where they are compared with memory; sizes that
report what a build wrote use decimal units (`19.0 GB`), as file managers and the Hub show them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

_BINARY_UNITS = ("KiB", "MiB", "GiB")
_DECIMAL_UNITS = (("GB", 10**9), ("MB", 10**6), ("kB", 10**3))
_COUNT_UNITS = (("B", 10**9), ("M", 10**6), ("K", 10**3))


def binary_size(num_bytes: float | None) -> str:
    """`512 B`, `1.5 KiB` ... up to GiB (a terabyte reads `1024.0 GiB`); empty for None."""
    if num_bytes is None:
        return ""
    if num_bytes < 1024:
        return f"{int(num_bytes)} B"
    value = float(num_bytes)
    for unit in _BINARY_UNITS:
        value /= 1024
        if value < 1024 or unit == _BINARY_UNITS[-1]:
            break
    return f"{value:.1f} {unit}"


def gib(num_bytes: float) -> str:
    """Always in GiB, for memory and disk requirements that are compared with each other."""
    return f"{num_bytes / 2**30:.1f} GiB"


def decimal_size(num_bytes: int) -> str:
    """`999 B`, `4.5 MB`, `19.0 GB`."""
    for unit, scale in _DECIMAL_UNITS:
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} B"


def count(n: int) -> str:
    """Parameter and token counts: `2.18 M`, `9.53 B`, `950`."""
    for unit, scale in _COUNT_UNITS:
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def first_few(items: Sequence[object], limit: int, separator: str = "; ") -> str:
    """The first `limit` items joined, and how many more there are: `a; b; c (and 4 more)`."""
    shown = separator.join(str(item) for item in items[:limit])
    hidden = len(items) - limit
    return f"{shown} (and {hidden} more)" if hidden > 0 else shown


def utc_minute() -> str:
    """Now, as reports and results state when they were made: `2026-12-03 05:40 UTC`."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def utc_timestamp() -> str:
    """Now, as manifests record it: `2026-12-03T05:40:12Z`."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A pipe table of every report and card, cells as given (a `|` inside one is the caller's to escape).

    `align` has a letter per column, `l` left or `r` right; by default the first column is text and the others
    numbers (`lrr...`)."""
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align {align!r} does not give l or r for each of {len(header)} columns")
    rule = "|" + "".join("---|" if side == "l" else "---:|" for side in align)
    return "\n".join([_table_row(header), rule, *(_table_row(row) for row in rows)])


def _table_row(cells: Sequence[object]) -> str:
    # An empty cell is one space wide, so a blank header reads `| | |`.
    return "|" + "|".join(f" {cell} " if str(cell) else " " for cell in cells) + "|"


def facts_table(title: str, facts: dict[str, str]) -> list[str]:
    """The lines that open a report: its title, then one row per fact (machine, date, versions, command...)."""
    return [f"# {title}", "", *markdown_table(("", ""), facts.items(), "ll").splitlines()]
