"""The commands that made a release folder and its card, rebuilt from what each step recorded (not shell history).

Every path and flag is the one the run used: the source as the manifest names it (a Hub id at its revision, or the
local folder, with the `make-tiny` run that wrote it when its card says so), the quantize flags the manifest
recorded, the DATA folder and eval settings of results.json, the `bench throughput` command of the report the card
shows, and the card's own flags.
"""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clef_quant import shipped
from clef_quant.evaluation.sources import FIXTURES, HUB
from clef_quant.evaluation.tasks import load_tasks
from clef_quant.publish.results import EvalResults
from clef_quant.quantize.contents import CODE_REASON
from clef_quant.release_folder.manifest import Manifest, is_shipped_recipe
from clef_vllm.engine.engine_settings import EngineSettings
from clef_vllm.format.encoding import DEFAULT_MAX_LENGTH

if TYPE_CHECKING:
    from clef_quant.publish.card import CardConfig

DEFAULT_DEVICE = "cpu"


def reproduce_commands(
    manifest: Manifest,
    config: CardConfig,
    *,
    source_revision: str | None,
    repo_id: str,
    results: EvalResults,
    tiny: dict[str, Any] | None,
    throughput_command: str | None,
) -> list[str]:
    """make-tiny (when the source is one), build-data, quantize, eval, bench throughput (when shown), card and
    upload, with the flags that give this folder and these numbers."""
    source_id = manifest.source.id
    folder = str(config.folder)
    commands = []
    if tiny is not None:
        commands.append(_join("clef-quant", "make-tiny", source_id, "--size", tiny["size"], "--seed", tiny["seed"]))
    commands.append(_build_data(results))
    commands.append(quantize_command_line(manifest, source_id, source_revision, folder))
    commands.append(_evaluate(results, Path(config.results)))
    if throughput_command:
        commands.append(throughput_command)
    commands.append(_card(config, repo_id))
    commands.append(_join("clef-quant", "upload", folder, "--repo-id", repo_id))
    return commands


def _join(*words: Any) -> str:
    return shlex.join(str(w) for w in words)


def _build_data(results: EvalResults) -> str:
    summary = results.data_summary
    words: list[Any] = ["clef-quant", "build-data", "--out", results.results.data.folder or "data"]
    if summary.source and summary.source != HUB:
        # The shipped fixtures are recorded by their repository path; `fixtures` names them wherever clef-quant runs.
        shipped_fixtures = summary.source == shipped.display(shipped.fixtures())
        words += ["--source", FIXTURES if shipped_fixtures else summary.source]
    for flag, value in (
        ("--per-task", summary.per_task),
        ("--calibration-count", summary.calibration_requested),
        ("--seed", summary.seed),
    ):
        if value is not None:
            words += [flag, value]
    tasks = list(summary.tasks)
    if tasks and set(tasks) != {task.name for task in load_tasks()}:  # every default task needs no --task
        for task in tasks:
            words += ["--task", task]
    if summary.tokenizer:
        words += ["--tokenizer", summary.tokenizer]
    return _join(*words)


def quantize_command_line(manifest: Manifest, source_id: str, revision: str | None, out: str) -> str:
    """The `clef-quant quantize` command that made the release, with every flag the manifest recorded."""
    recipe, calibration = manifest.recipe, manifest.calibration
    recipe_file, variables = recipe.file, recipe.variables
    words: list[Any] = ["clef-quant", "quantize", source_id]
    if revision and not manifest.source.local:
        words += ["--revision", revision]
    if manifest.scheme == "auto":  # the mix is rebuilt from the scan under the same target
        words += ["--scheme", "auto", "--scan", recipe_file]  # an auto recipe's file is the scan it came from
        if variables.get("max_kl") is not None:
            words += ["--max-kl", variables["max_kl"]]
        else:
            words += ["--max-size-gb", variables.get("max_size_gb")]
    elif is_shipped_recipe(recipe):  # a --scheme's own recipe
        words += ["--scheme", manifest.scheme]
    else:
        words += ["--recipe", recipe_file]
    if calibration.source:
        if not calibration.source.startswith("default:"):
            words += ["--calibration", calibration.source]
        words += ["--calibration-records", calibration.requested or calibration.records]
        words += ["--max-seq-len", calibration.max_seq_len]
    for included in manifest.included:
        if included.why != CODE_REASON:  # release code is carried without being asked for
            words += ["--include", included.path]
    device = manifest.run.device or DEFAULT_DEVICE
    if device != DEFAULT_DEVICE:
        words += ["--device", device]
    return _join(*words, "--out", out)


def _evaluate(results: EvalResults, out: Path) -> str:
    written = results.results
    config = written.config
    reference = config.reference or results.reference.folder
    words: list[Any] = ["clef-quant", "eval", "--reference", reference]
    for candidate in config.candidates or [side.folder for side in results.candidates]:
        words += ["--candidate", candidate]
    words += ["--data", written.data.folder or "data", "--out", out]
    engine = config.engine
    settings = EngineSettings(
        model=str(reference),
        max_model_len=config.max_model_len or DEFAULT_MAX_LENGTH,
        enforce_eager=str(engine.get("enforce_eager")) == "True",
        batch_invariant=str(engine.get("batch_invariant")) != "False",
        engine_arg=tuple(
            f"{key}={engine_arg_value(value)}" for key, value in engine.items() if key not in EVAL_ENGINE_FLAGS
        ),
    )
    flags = settings.command_line()[2:]  # eval names the model --reference
    if config.max_model_len and "--max-model-len" not in flags:  # recorded, so written even at its default
        flags = [settings.flag("max_model_len"), config.max_model_len, *flags]
    if (config.reference_device or DEFAULT_DEVICE) != DEFAULT_DEVICE:
        flags += ["--device", config.reference_device]
    return _join(*words, *flags)


# The engine settings eval records that are flags of its own (or not flags at all); every other one came from an
# --engine-arg.
EVAL_ENGINE_FLAGS = ("max_model_len", "batch_invariant", "enforce_eager")


def engine_arg_value(recorded: Any) -> str:
    """An --engine-arg VALUE that reads back as the value eval recorded (the Python repr of what it parsed):
    JSON, or the plain text where the text is what --engine-arg took (it reads VALUE as JSON when it parses)."""
    try:
        value = ast.literal_eval(recorded) if isinstance(recorded, str) else recorded
    except (ValueError, SyntaxError):
        return str(recorded)  # not a literal: kept as written
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value
    return json.dumps(value)


def _card(config: CardConfig, repo_id: str) -> str:
    words: list[Any] = ["clef-quant", "card", config.folder, "--results", config.results]
    for flag, value in (
        ("--throughput", config.throughput),
        ("--base-model", config.base_model),
        ("--license", config.license),
        ("--notice", config.notice),
    ):
        if value:
            words += [flag, value]
    words += ["--repo-id", repo_id]
    if not config.plots:
        words.append("--no-plots")
    return _join(*words)
