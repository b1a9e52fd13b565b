"""`clef-quant bench ...`: measure parts of the stack and write a markdown report under bench/results/.

One module per command, each parsing its options, calling the benchmark in `clef_quant.bench` and printing what
it measured; this module only assembles them.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from clef_quant.cli._errors import fail
from clef_quant.cli.bench import head, latency, modes, quantize, quantize_vs_plain, serve, throughput, workloads

# Options of earlier versions that became commands of their own, by (command, option). Not read as the new command
# (their --out meant another file, and other options go with them), but refused in one line naming it, before the
# old command parses anything: an option only the new command knows would otherwise be the error shown.
MOVED_TO_COMMANDS = {("quantize", "--against-plain"): "quantize-vs-plain"}


class BenchCommands(TyperGroup):
    """The `bench` group, which refuses an option of MOVED_TO_COMMANDS given to its old command."""

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if not ctx.resilient_parsing:  # shell completion resolves commands too; it must not print errors
            for option in rest:
                moved = MOVED_TO_COMMANDS.get((name or "", option))
                if moved is not None:
                    raise fail(f"{option} is now a command of its own: clef-quant bench {moved}")
        return name, command, rest


app = typer.Typer(
    cls=BenchCommands,
    help="Measure parts of the stack; each command writes a markdown report.\n\n"
    "Example: clef-quant bench head --device cuda --dtype bfloat16",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def bench() -> None:
    """A callback keeps `bench` a group of commands while it holds only one."""


# One module per command, in the order --help lists them.
COMMANDS = {
    "head": head.head,
    "serve": serve.serve,
    "modes": modes.modes,
    "throughput": throughput.throughput,
    "quantize": quantize.quantize,
    "quantize-vs-plain": quantize_vs_plain.quantize_vs_plain,
    "workloads": workloads.workloads,
    "latency": latency.latency,
}
for name, command in COMMANDS.items():
    app.command(name)(command)
