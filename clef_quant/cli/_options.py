"""Options shared by several commands, defined once from their sources of truth.

Choices come from the data that defines them (the scheme registry of `recipes/`, `SIZES`), so `--help` lists them and a
bad value ends like every other user error: one `error:` line on stderr, exit 2, before anything loads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from clef_quant.cli._errors import fail
from clef_quant.devices import DEVICE_HELP, device_problem, is_cuda
from clef_quant.quantize.recipes import check_scheme, scheme_choices
from clef_quant.tiny.sizes import SIZES
from clef_vllm.engine.options import HELP as ENGINE_ARG_HELP

if TYPE_CHECKING:
    from clef_vllm.engine.engine_settings import EngineSettings

QUANTIZE_SCHEMES = scheme_choices()


def name_choice(names: Iterable[str], refusal: str) -> Callable[[str], str]:
    """A parser that accepts one of `names`; anything else is refused with `refusal` (formatted with the
    `value`) and every name there is."""
    choices = tuple(names)

    def parse(value: str) -> str:
        if value not in choices:
            raise fail(f"{refusal.format(value=value)}; choose one of {', '.join(choices)}")
        return value

    return parse


def choice_option(names: Iterable[str], what: str, help_text: str, refusal: str | None = None) -> Any:
    """`--WHAT NAME`, limited to `names`, which `--help` lists."""
    choices = tuple(names)
    return typer.Option(
        f"--{what}",
        parser=name_choice(choices, refusal or f"unknown {what} {{value!r}}"),
        metavar=what.upper(),
        help=f"{help_text} One of {', '.join(choices)}.",
    )


def parse_scheme(value: str) -> str:
    from clef_quant.quantize.errors import QuantizeError

    try:
        return check_scheme(value)
    except QuantizeError as exc:
        raise fail(str(exc)) from None


def scheme_option(help_text: str) -> Any:
    """`--scheme NAME`: a scheme of the registry or auto, checked by the library's own check, once: the value it
    hands on is a `SchemeName`, which the run it starts takes as checked."""
    return typer.Option(
        "--scheme", parser=parse_scheme, metavar="SCHEME", help=f"{help_text} One of {', '.join(QUANTIZE_SCHEMES)}."
    )


DTYPES = ("bfloat16", "float32")


def dtype_option(help_text: str) -> Any:
    return choice_option(DTYPES, "dtype", help_text, refusal="--dtype cannot be {value!r}")


def parse_device(value: str) -> str:
    problem = device_problem(value)
    if problem is not None:
        raise fail(problem, hint="use --device cpu" if is_cuda(value) else None)
    return value


def device_option(help_text: str, **kwargs: Any) -> Any:
    return typer.Option("--device", parser=parse_device, metavar="DEVICE", help=help_text, **kwargs)


def parse_repo_id(value: str) -> str:
    from clef_quant.publish.errors import PublishError
    from clef_quant.publish.upload import validate_repo_id

    try:
        validate_repo_id(value)
    except PublishError as exc:
        raise fail(str(exc)) from None
    return value


def repo_id_option(help_text: str, **kwargs: Any) -> Any:
    return typer.Option("--repo-id", parser=parse_repo_id, metavar="ORG/NAME", help=help_text, **kwargs)


DeviceOption = Annotated[str, device_option(f"Where to run: {DEVICE_HELP}.")]
SizeOption = Annotated[
    str,
    choice_option(
        SIZES,
        "size",
        "tiny: a few MB, tests; small: tens of millions of parameters, CPU benchmarks; flash: clef-flash shapes, "
        "9.4 B parameters, 19 GB; clef: the 27B's shapes, 27.5 B parameters, 55 GB; omni: Clef-Omni's (the "
        "Qwen3-Omni-30B-A3B thinker), 31.8 B parameters, 64 GB; clef-tiny, omni-tiny: those architectures at a few "
        "MB. Build flash, clef and omni with --device cuda.",
    ),
]
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
# The one declaration of --max-model-len: every command takes it with the same bound as clef-systemone's
# (`server/settings.py`, at least 1) and says what it is for in its own words.
MAX_MODEL_LEN_MIN = 1
MAX_MODEL_LEN_HELP = "Maximum prompt length in tokens; the state is cut to fit."


def max_model_len_option(help_text: str = MAX_MODEL_LEN_HELP, **kwargs: Any) -> Any:
    return typer.Option("--max-model-len", min=MAX_MODEL_LEN_MIN, metavar="TOKENS", help=help_text, **kwargs)


MaxModelLenOption = Annotated[int, max_model_len_option()]
EnforceEagerOption = Annotated[
    bool,
    typer.Option(
        "--enforce-eager/--no-enforce-eager",
        help="Run vLLM without torch.compile and CUDA graphs (on a GPU both are on by default; a CPU starts much "
        "faster without them).",
    ),
]
# The calibration length (llm-compressor's max_seq_length) is a separate idea from the engine's --max-model-len:
# how much of each calibration record the quantizer sees, not what the release accepts; it keeps its own name.
MAX_SEQ_LEN_HELP = "Calibration length in tokens (not the engine's --max-model-len); the state is cut to fit."


def _calibration_check(records: int | None, max_seq_len: int) -> None:
    from clef_quant.quantize.calibration import check_calibration_settings
    from clef_quant.quantize.errors import QuantizeError

    try:
        check_calibration_settings(records, max_seq_len)
    except QuantizeError as exc:
        raise fail(str(exc)) from None


def parse_calibration_records(value: str) -> int:
    number = _integer(value, "--calibration-records")
    _calibration_check(number, 1)
    return number


def parse_max_seq_len(value: str) -> int:
    number = _integer(value, "--max-seq-len")
    _calibration_check(None, number)
    return number


def _integer(value: str, flag: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise fail(f"{flag} must be a whole number, not {value!r}") from None


def calibration_records_option(help_text: str) -> Any:
    """`--calibration-records N`: how many calibration records quantize, scan and bench quantize draw."""
    return typer.Option("--calibration-records", parser=parse_calibration_records, metavar="N", help=help_text)


def max_seq_len_option(help_text: str = MAX_SEQ_LEN_HELP) -> Any:
    return typer.Option("--max-seq-len", parser=parse_max_seq_len, metavar="TOKENS", help=help_text)


def parse_scannable(value: str) -> str:
    from clef_quant.quantize.errors import QuantizeError
    from clef_quant.quantize.registry import schemes

    try:
        schemes().check_scannable([value])
    except QuantizeError as exc:
        raise fail(str(exc)) from None
    return value


def scan_scheme_option(help_text: str) -> Any:
    """`--scheme NAME` of scan: a scheme whose units can be switched on alone, checked by the library's check."""
    from clef_quant.quantize.registry import schemes

    return typer.Option(
        "--scheme",
        parser=parse_scannable,
        metavar="SCHEME",
        help=f"{help_text} One of {', '.join(schemes().scannable())}.",
    )


# Option names that were renamed to the ones vLLM users know. The old ones are still read on every command,
# matched before parsing, so they need no option of their own and never show in --help.
RENAMED_OPTIONS = {
    "eager": "enforce-eager",
    "no-eager": "no-enforce-eager",
    "max-length": "max-model-len",
}


# eval's and bench throughput's --batch-size of earlier versions: the reference scores one record per forward pass
# now (clef_quant/reference.py says why). Still read, so older commands run, and said to be unused.
BatchSizeRetiredOption = Annotated[int | None, typer.Option("--batch-size", min=1, hidden=True)]


def warn_batch_size_retired(batch_size: int | None) -> None:
    if batch_size is not None:
        typer.secho(
            "warning: --batch-size is no longer used: the reference scores one record per forward pass, so a "
            "record's probabilities do not depend on the records scored beside it",
            fg=typer.colors.YELLOW,
            err=True,
        )


# build-data's count of calibration records was --calibration, which quantize and scan use for a file. Only
# build-data still reads that spelling (so RENAMED_OPTIONS, which every command reads, cannot hold it), and says so.
CalibrationCountRenamedOption = Annotated[int | None, typer.Option("--calibration", min=0, hidden=True)]


def read_calibration_count(count: int, renamed: int | None) -> int:
    """build-data's count: --calibration-count, or the old --calibration with a warning naming the new flag."""
    if renamed is None:
        return count
    typer.secho(
        "warning: build-data's --calibration is now --calibration-count (quantize and scan's --calibration is a file)",
        fg=typer.colors.YELLOW,
        err=True,
    )
    return renamed


def renamed_option(name: str) -> str:
    """The current name of an option given without its dashes (click's `token_normalize_func`)."""
    return RENAMED_OPTIONS.get(name, name)


def engine_settings(
    model: str | Path,
    *,
    max_model_len: int,
    batch_invariant: bool = True,
    enforce_eager: bool = False,
    engine_arg: list[str] | None = None,
    server: bool = False,
    prompt_chunk: int | None = None,
) -> EngineSettings:
    """The engine settings a command's flags give (`--engine-arg` values for keys with a field there set it), or
    one `error:` line for a value no engine takes. `server`: the command also starts clef-systemone with them, so
    `--engine-arg` is checked as it checks it (keys it has a flag for are refused), before anything runs rather
    than when the server exits. `prompt_chunk`: the command's --prompt-chunk (pieces of text prompts, so the engine
    also loads no vision tower)."""
    from clef_vllm.engine.engine_settings import EngineSettings
    from clef_vllm.engine.options import engine_overrides
    from clef_vllm.errors import SettingsError
    from clef_vllm.server.settings import ServeConfig

    if server:
        try:
            engine_overrides(engine_arg or [], ServeConfig.own_flags())
        except SettingsError as exc:
            why = "clef-systemone refuses it, and every engine this command starts, its servers too, gets --engine-arg"
            raise fail(str(exc), hint=why) from None
    # Named only when given: a field named here makes `--engine-arg` refuse its key, pointing to a flag.
    pieces = {"prompt_chunk": prompt_chunk, "language_model_only": True} if prompt_chunk is not None else {}
    try:
        return EngineSettings.from_engine_args(
            model,
            engine_arg or [],
            max_model_len=max_model_len,
            batch_invariant=batch_invariant,
            enforce_eager=enforce_eager,
            **pieces,
        )
    except SettingsError as exc:
        raise fail(str(exc)) from None


def check_engines(folders: Iterable[str | Path], settings: EngineSettings) -> None:
    """Each release's engine checked as it would start with `settings` (vLLM's configuration of it, nothing
    loaded), before the command does any work: a release without kernels here or a value vLLM refuses ends it in
    one line."""
    from clef_vllm.engine.check import check_settings

    for folder in folders:
        check_settings(settings.for_model(folder))


EngineArgOption = Annotated[
    list[str] | None,
    typer.Option("--engine-arg", metavar="KEY=VALUE", help=f"{ENGINE_ARG_HELP[0].upper()}{ENGINE_ARG_HELP[1:]}."),
]
BATCH_INVARIANT_HELP = (
    "Answers that do not move with load: every record's probabilities are the same bits whatever else is in the "
    "engine (on a GPU vLLM batches whole prompts with its batch-invariant kernels; on a CPU each engine step runs "
    "one prompt). --no-batch-invariant lets vLLM batch and split prompts freely: probabilities then move in the "
    "third decimal with the batch, which raises the noise floor."
)
