"""Options shared by several commands, defined once."""

from __future__ import annotations

from typing import Annotated

import typer

ModelOption = Annotated[
    str,
    typer.Option("--model", "-m", help="Release folder, or a Hub id (ORG/NAME) when the Hub is reachable."),
]
RevisionOption = Annotated[
    str | None, typer.Option("--revision", help="Hub revision (branch, tag or commit) for a Hub id.")
]
RequestArgument = Annotated[
    str, typer.Argument(help="SystemOne request body as a JSON file, or - for standard input.", metavar="REQUEST.json")
]
MaxLengthOption = Annotated[
    int, typer.Option("--max-length", min=1, help="Maximum prompt length in tokens; the state is cut to fit.")
]
