"""`python -m clef_quant ...`: the `clef-quant` command, for environments whose scripts folder is not on PATH."""

from clef_quant.cli import main

main()
