"""Where command results go: standard output, at full width when that is a file or a pipe.

Rich sizes a console that is not a terminal at 80 columns and cuts table cells to fit (`NVF…`), which is what
a user saving `clef-quant inspect DIR > report.txt` does not want. Results written elsewhere get room enough
for every cell; a terminal keeps its own width.
"""

from __future__ import annotations

import sys

from rich.console import Console

UNBOUNDED_WIDTH = 10_000


def results_console() -> Console:
    """A console on standard output for tables and summaries."""
    return Console(width=None if sys.stdout.isatty() else UNBOUNDED_WIDTH)
