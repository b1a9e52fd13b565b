"""The `clef-quant` command line: this module only assembles the command groups."""

from __future__ import annotations

import typer

from clef_quant.cli import bench, encode, evaluate, quantize, release, scan, score, tiny
from clef_quant.cli._errors import OneLineUsageErrors
from clef_quant.cli._options import renamed_option

app = typer.Typer(
    name="clef-quant",
    cls=OneLineUsageErrors,
    help="Quantize, evaluate, document and serve Clef decision-model releases.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"token_normalize_func": renamed_option},  # every subcommand's context inherits it
)
app.command("encode")(encode.encode)
app.command("score")(score.score)
app.command("make-tiny")(tiny.make_tiny)
app.command("quantize")(quantize.quantize)
app.command("inspect")(quantize.inspect_checkpoint)
app.command("scan")(scan.scan)
app.command("build-data")(evaluate.build_data)
app.command("eval")(evaluate.evaluate)
app.command("card")(release.card)
app.command("upload")(release.upload)
app.add_typer(bench.app, name="bench")


def main() -> None:
    app()
